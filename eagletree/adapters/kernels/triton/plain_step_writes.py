"""Triton: a plain step's per-row writes in one launch (``domain.draft_lag``).

The reference scatters into five tensors with about ten small torch ops (a gather, a clamp,
index writes, two additions), which every plain step of a speculative worker runs inside its
graph; one program per request does them all. Results on every row but a repeated padding
row equal ``domain.draft_lag.plain_step_writes``'s bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_F = 1024  # feature elements a program moves per iteration


@triton.jit
def _plain_step_writes_kernel(
    rows_ptr,  # (bs,) int64
    tokens_ptr,  # (bs,) int64
    features_ptr,  # (bs, F), rows feature_stride apart
    seq_lens_ptr,  # (bs,) int64
    lag_tokens_ptr,  # (R, W) int64
    lag_features_ptr,  # (R, W, F) contiguous
    lag_count_ptr,  # (R,) int64
    committed_ptr,  # (R,) int64
    pending_ptr,  # (R,) int64, unused without HAS_PENDING
    width,
    num_features,
    feature_stride,
    HAS_PENDING: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + i)
    token = tl.load(tokens_ptr + i)
    column = tl.minimum(tl.load(lag_count_ptr + row), width - 1)
    tl.store(lag_tokens_ptr + row * width + column, token)
    source = features_ptr + i * feature_stride
    target = lag_features_ptr + (row * width + column) * num_features
    for start in range(0, num_features, BLOCK_F):
        offsets = start + tl.arange(0, BLOCK_F)
        inside = offsets < num_features
        values = tl.load(source + offsets, mask=inside)
        tl.store(target + offsets, values.to(lag_features_ptr.dtype.element_ty), mask=inside)
    tl.store(lag_count_ptr + row, column + 1)
    tl.store(committed_ptr + row, tl.load(seq_lens_ptr + i) + 1)
    if HAS_PENDING:
        tl.store(pending_ptr + row, token)


def plain_step_writes(
    rows: torch.Tensor,
    tokens: torch.Tensor,
    features: torch.Tensor,
    seq_lens: torch.Tensor,
    lag_tokens: torch.Tensor,
    lag_features: torch.Tensor,
    lag_count: torch.Tensor,
    committed: torch.Tensor,
    pending: torch.Tensor | None,
) -> None:
    """``domain.draft_lag.plain_step_writes`` in one launch; the same arguments (the integer
    tensors int64, the state tensors contiguous, ``features`` rows of unit stride)."""
    bs = rows.shape[0]
    if bs == 0:
        return
    assert lag_features.is_contiguous() and features.stride(-1) == 1, "unit-stride features"
    _plain_step_writes_kernel[(bs,)](
        rows.contiguous(),
        tokens.contiguous(),
        features,
        seq_lens.contiguous(),
        lag_tokens,
        lag_features,
        lag_count,
        committed,
        lag_count if pending is None else pending,
        lag_tokens.shape[1],
        features.shape[-1],
        features.stride(0),
        HAS_PENDING=pending is not None,
        BLOCK_F=_BLOCK_F,
    )
