"""What ``benchmarks.kv_move`` moves: the KV pools of three model layouts, and moves shaped like
the compaction plans of accepted paths.

Layouts: Llama-3.1-8B (32 layers, K and V of 8 heads x 128, bf16: 64 buffers of 2 KiB rows),
DeepSeek MLA (61 layers x 576 bf16: 61 buffers of 1152 B rows) and DSA (MLA plus per layer fp8
indexer keys of 128 B and an fp32 scale: 183 buffers). A move of n pairs: every request owns a
window of WINDOW scattered slots and moves the STEPS_PLUS_ONE nodes of an accepted path
(increasing, so targets and sources overlap) to the window's front.
"""

from __future__ import annotations

import torch

from eagletree.adapters.memory.row_movers import check_independent_groups

STEPS_PLUS_ONE = 6  # nodes of an accepted path: a request's group of pairs
WINDOW = 16  # slots a request owns


def layout_buffers(
    name: str, num_rows: int, device: torch.device, layers: int | None
) -> tuple[torch.Tensor, ...]:
    """Random-filled buffers of one layout, in pool order (never zeros: zeros hide bugs)."""
    bf16 = torch.bfloat16

    def randomised(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=device)
        words = buf.view(torch.uint8) if buf.element_size() == 1 else buf.view(torch.int16)
        words.random_()  # random bit patterns, any dtype
        return buf

    if name == "llama":
        n = 32 if layers is None else layers
        return tuple(randomised((num_rows, 8, 128), bf16) for _ in range(2 * n))
    n = 61 if layers is None else layers
    latent = [randomised((num_rows, 1, 576), bf16) for _ in range(n)]
    if name == "mla":
        return tuple(latent)
    assert name == "dsa"
    index_k = [randomised((num_rows, 128), torch.float8_e4m3fn) for _ in range(n)]
    scales = [randomised((num_rows,), torch.float32) for _ in range(n)]
    return tuple(b for layer in zip(latent, index_k, scales, strict=True) for b in layer)


def compaction_moves(
    num_pairs: int, num_rows: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (tgt, src) of full-length accepted paths in scattered windows of WINDOW slots."""
    requests = -(-num_pairs // STEPS_PLUS_ONE)
    windows = torch.randperm(num_rows - 1, generator=gen)[: requests * WINDOW] + 1
    windows = windows.view(requests, WINDOW)
    # path: node 0 (the root) then STEPS_PLUS_ONE - 1 increasing nodes, so node k >= k
    later = torch.rand(requests, WINDOW - 1, generator=gen).argsort(dim=1)[:, : STEPS_PLUS_ONE - 1]
    path = torch.cat([torch.zeros(requests, 1, dtype=torch.int64), later.sort(dim=1).values + 1], 1)
    tgt = windows[:, :STEPS_PLUS_ONE].reshape(-1)[:num_pairs]
    src = windows.gather(1, path).reshape(-1)[:num_pairs]
    return tgt, src


def make_moves(
    order: str, num_pairs: int, num_rows: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compaction_moves``, or for ``order="reversed"`` the same pairs in reverse order: where
    their count is no multiple of STEPS_PLUS_ONE, the groups no longer start at its multiples."""
    tgt, src = compaction_moves(num_pairs, num_rows, gen)
    return (tgt.flip(0), src.flip(0)) if order == "reversed" else (tgt, src)


def hint_holds(tgt: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether the pairs keep the promise of ``independent_groups=STEPS_PLUS_ONE``."""
    try:
        check_independent_groups(tgt, src, STEPS_PLUS_ONE)
    except ValueError:
        return False
    return True
