"""Triton: one forward's RoPE cos/sin tables in one launch.

What it replaces, operation for operation: ``RotaryEmbedding.forward``'s torch path, which
launches four kernels (five with an attention factor) a forward, and a speculative tree step
runs six forwards. The rounding is that path's: the position converted to fp32 and multiplied
once by the column's fp32 inverse frequency (torch's promoted product), cos and sin in fp32,
the attention factor multiplied in fp32 only when it is not 1, then one cast to the activation
dtype. Only the cos/sin implementations differ (the GPU's libdevice or the interpreter's
numpy against torch's libm), by a few fp32 ulps.

One program per block of ``ROWS`` positions, each holding the whole table width, so that a
decode step's handful of positions is one program and a long prefill's stay few.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 16  # positions per program


@triton.jit
def _rope_tables_kernel(
    positions_ptr,
    column_freq_ptr,
    tables_ptr,
    stride_positions,
    num_tokens,
    dim,
    attention_factor,
    ROWS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    SCALED: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_DIM)
    row_mask = rows < num_tokens
    col_mask = cols < dim
    position = tl.load(positions_ptr + rows * stride_positions, mask=row_mask, other=0)
    freq = tl.load(column_freq_ptr + cols, mask=col_mask, other=0.0)
    # (ROWS, BLOCK_DIM) angles: one fp32 product, as torch's int64 × fp32 promotion rounds it
    angles = position.to(tl.float32)[:, None] * freq[None, :]
    cos = tl.cos(angles)
    sin = tl.sin(angles)
    if SCALED:
        cos = cos * attention_factor
        sin = sin * attention_factor
    mask = row_mask[:, None] & col_mask[None, :]
    # tables (2, num_tokens, dim), contiguous: row r of cos is row r, of sin row num_tokens + r
    cos_rows = tables_ptr + rows[:, None] * dim + cols[None, :]
    sin_rows = tables_ptr + (rows[:, None] + num_tokens) * dim + cols[None, :]
    out_dtype = tables_ptr.dtype.element_ty
    tl.store(cos_rows, cos.to(out_dtype), mask=mask)
    tl.store(sin_rows, sin.to(out_dtype), mask=mask)


def rope_tables(
    positions: torch.Tensor,
    column_freq: torch.Tensor,
    attention_factor: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """(2, n, dim) tables in ``dtype``: [0] ``cos(position · freq) · factor``, [1] the sin."""
    # positions: (n,) int, any stride; column_freq: (dim,) fp32 contiguous -> (2, n, dim)
    if positions.dim() != 1 or positions.dtype.is_floating_point:
        raise ValueError(
            f"rope_tables needs (n,) integer positions, got {tuple(positions.shape)}"
            f" {positions.dtype}"
        )
    if column_freq.dim() != 1 or column_freq.dtype != torch.float32 or column_freq.stride(0) != 1:
        raise ValueError(
            f"rope_tables needs (dim,) contiguous fp32 column frequencies, got"
            f" {tuple(column_freq.shape)} {column_freq.dtype} strides {column_freq.stride()}"
        )
    num_tokens, dim = positions.shape[0], column_freq.shape[0]
    tables = torch.empty(2, num_tokens, dim, dtype=dtype, device=column_freq.device)
    if num_tokens == 0 or dim == 0:
        return tables
    _rope_tables_kernel[(triton.cdiv(num_tokens, ROWS),)](
        positions,
        column_freq,
        tables,
        positions.stride(0),
        num_tokens,
        dim,
        attention_factor,
        ROWS=ROWS,
        BLOCK_DIM=triton.next_power_of_2(dim),
        SCALED=attention_factor != 1.0,
        num_warps=4,
    )
    return tables
