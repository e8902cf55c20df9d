"""Triton: each row's tempered softmax, or a one-hot on its first maximum where the row is
greedy (``domain.sampling.tempered_probs`` semantics), in one launch.

The torch reference is about eight kernels a call (the float copy, the temperature's select and
division, the softmax, the argmax's reduction, the one-hot's fill and scatter, the final
select), and a sampled step calls it once per draft depth and once for the target's nodes: on
the H200 at bs 1 the argmax's reduction and the softmax alone took 7 and 6 µs a launch, a
tenth of a T 1 chain step of the real pair. Here a program reads its row twice: an online
maximum and sum of exp(logit / t − max) with the first maximum of the logits, then the
probabilities written. exp and the division round as Triton's do, not as torch's: equal to
the reference within float32 rounding, the one-hot rows bit for bit. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.draw_children import row_block, unit_columns


@triton.jit
def _tempered_probs_kernel(
    logits_ptr,  # (rows, V), any float dtype, unit column stride
    temperature_ptr,  # (rows,) float32
    probs_ptr,  # (rows, V) float32 out, unit column stride
    vocab,
    stride_row,
    stride_out,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(temperature_ptr + row)
    greedy = t <= 0
    scale = 1.0 / tl.where(greedy, 1.0, t)
    source = logits_ptr + row * stride_row
    offs = tl.arange(0, BLOCK_V)
    neg_inf = float("-inf")
    total = tl.sum(tl.zeros([BLOCK_V], dtype=tl.float32), axis=0)  # Σ exp(x − top) so far
    top = total + neg_inf  # the maximum of x = logit / t so far
    best = top  # the logits' maximum and its first column
    best_col = row * 0
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        logits = tl.load(source + cols, mask=cols < vocab, other=neg_inf).to(tl.float32)
        x = logits * scale
        block_top = tl.max(x, axis=0)
        new_top = tl.maximum(top, block_top)
        # -inf columns (outside a draft vocabulary, or past the row) weigh exp(-inf) = 0; while
        # every column so far is one, shifting by 0 keeps exp(-inf − -inf) from being nan
        shift = tl.where(new_top == neg_inf, 0.0, new_top)
        total = total * tl.exp(top - shift) + tl.sum(tl.exp(x - shift), axis=0)
        top = new_top
        block_best = tl.max(logits, axis=0)
        first = tl.min(tl.where(logits == block_best, cols, vocab), axis=0).to(tl.int64)
        better = block_best > best
        best_col = tl.where(better, first, best_col)
        best = tl.maximum(best, block_best)
    out = probs_ptr + row * stride_out
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        ok = cols < vocab
        logits = tl.load(source + cols, mask=ok, other=neg_inf).to(tl.float32)
        probs = tl.exp(logits * scale - top) / total
        one_hot = tl.where(cols == best_col, 1.0, 0.0)
        tl.store(out + cols, tl.where(greedy, one_hot, probs), mask=ok)


def tempered_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    block_v: int = 1024,
) -> torch.Tensor:
    """``domain.sampling.tempered_probs`` in one launch: (rows, V) logits, (rows,)
    temperatures → (rows, V) float32, into ``out`` where given (a unit column stride, any row
    stride: a row of a larger buffer). ``block_v``: the columns a pass reads at once (tests
    shrink it to cross blocks)."""
    rows, vocab = logits.shape
    if out is None:
        probs = torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
    else:
        if out.shape != (rows, vocab) or out.dtype != torch.float32 or out.stride(1) != 1:
            raise ValueError(
                f"tempered_probs writes ({rows}, {vocab}) float32 rows of unit column stride, "
                f"got out {tuple(out.shape)} {out.dtype} strides {out.stride()}"
            )
        probs = out
    if rows == 0 or vocab == 0:
        return probs
    logits = unit_columns(logits)
    _tempered_probs_kernel[(rows,)](
        logits,
        temperature.float().contiguous(),
        probs,
        vocab,
        logits.stride(0),
        probs.stride(0),
        BLOCK_V=row_block(vocab, block_v),
        num_warps=4,
    )
    return probs
