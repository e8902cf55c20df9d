"""Triton: what one pool-attention launch needs — tile sizes, query tiles, tail keys.

Built by the Triton backend per forward (``QueryTiles``, ``TailKeys``) and per layer shape
(``LaunchConfig``), read by ``pool_attention.pool_attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


def block_dim(n: int) -> int:
    """Power-of-two block covering ``n`` columns, at least 16 (tl.dot's smallest operand)."""
    return max(16, triton.next_power_of_2(n)) if n > 0 else 0


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Tile sizes and compilation switches of one launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dot_fp32: bool  # fp32 dot operands (CPU interpreter, fp32 inputs)
    min_chunk: int  # fewest keys one split handles (a multiple of block_n)
    max_registers: int | None = None  # per-thread register cap (ptxas .maxnreg), CUDA only


@dataclass(frozen=True, slots=True)
class QueryTiles:
    """Where the query tiles lie: fixed width (``tile_req is None``) or ragged (EXTEND)."""

    num_tiles: int
    tiles_per_req: int = 0  # fixed width: tiles of one request
    qo_indptr: torch.Tensor | None = None  # ragged: (bs + 1,) token offsets
    tile_req: torch.Tensor | None = None  # ragged: (num_tiles,) request, −1 past the last tile
    tile_idx: torch.Tensor | None = None  # ragged: (num_tiles,) tile index in its request


@dataclass(frozen=True, slots=True)
class TailKeys:
    """The tail keys of every request and how rows see them (``metadata.TailKind`` values)."""

    kind: int  # 1 CAUSAL, 2 TREE, 3 BRANCH
    width: int = 0  # queries per request (fixed width); 0 when ragged
    depth: int = 0  # BRANCH: ancestors per branch
    ancestor_slots: torch.Tensor | None = None  # BRANCH: (bs·k, depth)
    tree_bits: torch.Tensor | None = None  # TREE: (bs·N, cdiv(N, 32)) int32, ``tree_bits``


def ragged_tiles(
    qo_indptr: torch.Tensor,
    query_lens: torch.Tensor,
    group: int,
    block_m: int,
    num_tokens: int,
    query_lens_cpu: torch.Tensor | None = None,
) -> QueryTiles:
    """Tile table of a ragged batch, built on the device (no host sync).

    The grid size is exact when the host has the lengths (``query_lens_cpu``), else the bound
    ``cdiv(num_tokens·group, block_m) + bs``; tiles past the last real one are marked −1 and
    return at once.
    """
    # qo_indptr: (bs + 1,) int64; query_lens: (bs,) int64
    bs = query_lens.shape[0]
    tiles = (query_lens * group + block_m - 1) // block_m  # (bs,)
    tile_end = torch.cumsum(tiles, dim=0)
    if query_lens_cpu is not None:  # a host tensor: no device sync
        num_tiles = int(((query_lens_cpu * group + block_m - 1) // block_m).sum())
    else:
        num_tiles = (num_tokens * group + block_m - 1) // block_m + bs
    index = torch.arange(num_tiles, dtype=torch.int64, device=query_lens.device)
    req = torch.searchsorted(tile_end, index, right=True)  # (num_tiles,) in [0, bs]
    first_tile = (tile_end - tiles)[req.clamp(max=bs - 1)]
    tile_req = torch.where(req < bs, req, -1)
    return QueryTiles(num_tiles, 0, qo_indptr, tile_req, index - first_tile)
