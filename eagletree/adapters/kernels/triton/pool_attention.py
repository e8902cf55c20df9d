"""Adapter: split-KV attention of packed query tiles over KV rows addressed by slot ids (Triton).

``pool_attention`` checks the operands, allocates the splits' partials and launches the kernel
of ``pool_attention_kernel`` (whose docstring says how a program walks its keys), then merges
the splits with ``split_merge.merge_splits``.
"""

from __future__ import annotations

import torch

from eagletree.adapters.kernels.triton.attention_launch import (
    LaunchConfig,
    QueryTiles,
    TailKeys,
    block_dim,
)
from eagletree.adapters.kernels.triton.pool_attention_kernel import _pool_attention_kernel
from eagletree.adapters.kernels.triton.split_merge import merge_splits


def pool_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor | None,
    out: torch.Tensor,
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    new_slots: torch.Tensor,
    tiles: QueryTiles,
    tail: TailKeys,
    shared_dim: int,
    sm_scale: float,
    logit_cap: float,
    num_splits: int,
    config: LaunchConfig,
) -> None:
    """Attention of every query over its prefix and visible tail keys, written into ``out``.

    ``shared_dim`` is the number of leading K columns scored in the first dot (all of head_dim for
    MHA, kv_lora_rank for MLA; the rest, MLA's rope part, is a second dot). With
    ``v_buffer is None`` the values are those first ``shared_dim`` K columns (MLA's latent).
    """
    # q: (num_tokens, H, Dk); k_buffer: (rows, Hk, Dk); v_buffer: (rows, Hk, Dv) or None;
    # out: (num_tokens, H, Dv), written in place
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_buffer.shape[1]
    value_dim = out.shape[2]
    assert q.stride(2) == 1 and k_buffer.stride(2) == 1 and out.stride(2) == 1
    assert num_heads % kv_heads == 0 and 0 < shared_dim <= head_dim
    v_from_k = v_buffer is None
    if v_from_k:
        assert value_dim == shared_dim, "values taken from K must be its first shared_dim columns"
        v_buffer = k_buffer
    else:
        assert v_buffer is not None and v_buffer.stride(2) == 1
    if num_tokens == 0 or tiles.num_tiles == 0:
        return
    dummy = seq_lens

    def pointer(t: torch.Tensor | None) -> torch.Tensor:
        return t if t is not None and t.numel() > 0 else dummy

    split = num_splits > 1
    if split:
        part_o = torch.empty(
            num_tokens, num_heads, num_splits, value_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device
        )
    else:
        part_o = part_lse = out
    grid = (tiles.num_tiles, kv_heads, num_splits)
    _pool_attention_kernel[grid](
        q,
        k_buffer,
        v_buffer,
        out,
        part_o,
        part_lse,
        req_to_token,
        req_pool_indices,
        seq_lens,
        new_slots,
        pointer(tail.ancestor_slots),
        pointer(tiles.qo_indptr),
        pointer(tiles.tile_req),
        pointer(tiles.tile_idx),
        pointer(tail.tree_bits),
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        num_heads,
        sm_scale,
        logit_cap,
        num_splits,
        config.min_chunk,
        tiles.tiles_per_req,
        tail.width,
        tail.depth,
        DA=shared_dim,
        DB=head_dim - shared_dim,
        DV=value_dim,
        GROUP=num_heads // kv_heads,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_DA=block_dim(shared_dim),
        BLOCK_DB=block_dim(head_dim - shared_dim),
        BLOCK_DV=block_dim(value_dim),
        TAIL=tail.kind,
        TAIL_WORDS=max(1, config.block_n // 32),
        RAGGED=tiles.tile_req is not None,
        V_FROM_K=v_from_k,
        DOT_FP32=config.dot_fp32,
        PRECISION="ieee" if config.dot_fp32 else None,
        HAS_CAP=logit_cap > 0,
        SPLIT=split,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **({} if config.max_registers is None else {"maxnreg": config.max_registers}),
    )
    if split:
        merge_splits(part_o, part_lse, out)
