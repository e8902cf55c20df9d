"""Triton: pack the tree part of a verify mask into int32 bit words, one launch per forward.

Row ``b·N + i`` of the output holds ``cdiv(N, 32)`` words; bit ``c % 32`` of word ``c // 32`` is
set when node i of request b sees node c (``metadata.tree_tail_bits`` is the torch reference).
A program packs 128 words; FULL_MASK rows are ``L_b + N`` long and only their last N columns are
read, QLEN_ONLY rows are N long. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pack_tree_bits_kernel(
    mask_ptr,  # flat uint8 tree mask
    mask_indptr_ptr,  # (bs + 1,) offsets of the requests' blocks
    seq_lens_ptr,  # (bs,) prefix lengths L_b
    out_ptr,  # (bs·N, words) int32, flat
    n,
    words,
    total_words,
    BLOCK: tl.constexpr,  # output words per program
    FULL: tl.constexpr,
):
    flat = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # output word index
    valid = flat < total_words
    row = flat // words  # b·N + i
    word = flat - row * words
    req = row // n
    node = row - req * n
    start = tl.load(mask_indptr_ptr + req, mask=valid, other=0).to(tl.int64)
    if FULL:
        prefix = tl.load(seq_lens_ptr + req, mask=valid, other=0).to(tl.int64)
        row_start = start + node.to(tl.int64) * (prefix + n) + prefix
    else:
        row_start = start + node.to(tl.int64) * n
    bit = tl.arange(0, 32)
    col = word[:, None] * 32 + bit[None, :]  # (BLOCK, 32) node columns
    seen = tl.load(mask_ptr + row_start[:, None] + col, mask=valid[:, None] & (col < n), other=0)
    # distinct bits: the int32 sum is their bitwise or, bit 31 included (no carry can occur)
    packed = tl.sum((seen != 0).to(tl.int32) << bit[None, :], axis=1)
    tl.store(out_ptr + flat, packed, mask=valid)


def pack_tree_bits(
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    seq_lens: torch.Tensor,
    num_nodes: int,
    full_mask: bool,
    out: torch.Tensor,
) -> torch.Tensor:
    """Write the packed tree of every request into ``out`` (bs·N, cdiv(N, 32)) int32; return it."""
    # tree_mask: flat bool; mask_indptr: (bs + 1,); seq_lens: (bs,)
    rows, words = out.shape
    assert words == (num_nodes + 31) // 32 and out.dtype == torch.int32 and out.is_contiguous()
    if rows == 0:
        return out
    block = 128
    total = rows * words
    _pack_tree_bits_kernel[(triton.cdiv(total, block),)](
        tree_mask.view(torch.uint8),
        mask_indptr,
        seq_lens,
        out,
        num_nodes,
        words,
        total,
        BLOCK=block,
        FULL=full_mask,
    )
    return out
