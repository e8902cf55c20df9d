"""Triton: rotate q and k (Llama's half-split RoPE) and store k and v in the KV pool, one launch.

What it replaces, operation for operation: ``RopeTables.rotate`` on q and k (products and their
sum each rounded to the activation dtype, as torch's elementwise ops round), then the pool's
``set_kv_buffer`` (rows converted to the storage dtype at ``out_cache_loc``). fp8 pools are
refused: compiled for sm_90 the conversion did not match torch's bit for bit, so they keep
``set_kv_buffer``. One program per token and block of heads (``heads_per_program``; q heads
first, then the kv heads, whose rows also copy that head's v), so the token's cos/sin rows are
loaded once per block rather than once per head. The launch turns off FMA contraction, which
would otherwise fuse a product into the sum and round once where torch rounds twice.

With ``norm_of`` the projection's input was a residual stream whose RMSNorm was folded away
(its weight into the projection, ``layers.fold_rms_weight``): each program computes the
token's ``rsqrt(mean(stream²) + eps)`` and scales q, k and v by it first, rounding them as
the projection's output would have been rounded. That costs each program one read of the
token's stream (from L2), once per block of heads, and saves the norm's launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.adapters.kernels.triton.row_rms import inverse_rms, norm_block

# storage dtypes the kernel refuses (``kv_rows`` keeps such pools on ``set_kv_buffer``)
FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


@triton.jit
def _rope_kv_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    loc_ptr,
    norm_ptr,
    q_out_ptr,
    k_buf_ptr,
    v_buf_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_rope,
    stride_norm,
    stride_q_out_tok,
    stride_q_out_head,
    stride_k_buf_slot,
    stride_k_buf_head,
    stride_v_buf_slot,
    stride_v_buf_head,
    num_q_heads,
    num_kv_heads,
    half,
    v_dim,
    norm_width,
    eps,
    HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_NORM: tl.constexpr,
    BLOCK_NORM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    # this program's HEADS heads of the token: q heads 0..Hq-1, then kv heads Hq..Hq+Hk-1
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    is_q = head < num_q_heads
    kv_head = tl.where(is_q, 0, head - num_q_heads)
    is_kv = (~is_q) & (kv_head < num_kv_heads)
    scale = 1.0
    if HAS_NORM:
        scale = inverse_rms(norm_ptr + token * stride_norm, norm_width, eps, BLOCK_NORM)
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < half
    rope_row = cos_ptr + token * stride_rope
    cos_lo = tl.load(rope_row + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    cos_hi = tl.load(rope_row + half + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    rope_row = sin_ptr + token * stride_rope
    sin_lo = tl.load(rope_row + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    sin_hi = tl.load(rope_row + half + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    act = q_out_ptr.dtype.element_ty
    # (HEADS, BLOCK_HALF) halves of each head's row, from q or k
    q_src = q_ptr + token * stride_q_tok + head[:, None] * stride_q_head + cols[None, :]
    k_src = k_ptr + token * stride_k_tok + kv_head[:, None] * stride_k_head + cols[None, :]
    q_mask = is_q[:, None] & mask[None, :]
    k_mask = is_kv[:, None] & mask[None, :]
    lo = tl.where(
        q_mask, tl.load(q_src, mask=q_mask, other=0.0), tl.load(k_src, mask=k_mask, other=0.0)
    ).to(tl.float32)
    hi = tl.where(
        q_mask,
        tl.load(q_src + half, mask=q_mask, other=0.0),
        tl.load(k_src + half, mask=k_mask, other=0.0),
    ).to(tl.float32)
    if HAS_NORM:
        lo = (lo * scale).to(act).to(tl.float32)
        hi = (hi * scale).to(act).to(tl.float32)
    # x·cos + rotate_half(x)·sin, each product and the sum rounded like torch's bf16/fp16 ops
    out_lo = ((lo * cos_lo).to(act).to(tl.float32) - (hi * sin_lo).to(act).to(tl.float32)).to(act)
    out_hi = ((hi * cos_hi).to(act).to(tl.float32) + (lo * sin_hi).to(act).to(tl.float32)).to(act)
    q_dst = q_out_ptr + token * stride_q_out_tok + head[:, None] * stride_q_out_head + cols[None, :]
    tl.store(q_dst, out_lo, mask=q_mask)
    tl.store(q_dst + half, out_hi, mask=q_mask)
    slot = tl.load(loc_ptr + token).to(tl.int64)
    k_dst = k_buf_ptr + slot * stride_k_buf_slot + kv_head[:, None] * stride_k_buf_head
    k_dst += cols[None, :]
    k_dtype = k_buf_ptr.dtype.element_ty
    tl.store(k_dst, out_lo.to(tl.float32).to(k_dtype), mask=k_mask)
    tl.store(k_dst + half, out_hi.to(tl.float32).to(k_dtype), mask=k_mask)
    v_cols = tl.arange(0, BLOCK_V)
    v_mask = is_kv[:, None] & (v_cols < v_dim)[None, :]
    v_src = v_ptr + token * stride_v_tok + kv_head[:, None] * stride_v_head + v_cols[None, :]
    v = tl.load(v_src, mask=v_mask, other=0.0)
    if HAS_NORM:
        v = (v.to(tl.float32) * scale).to(act)
    v_dst = v_buf_ptr + slot * stride_v_buf_slot + kv_head[:, None] * stride_v_buf_head
    tl.store(v_dst + v_cols[None, :], v.to(tl.float32).to(v_buf_ptr.dtype.element_ty), mask=v_mask)


def heads_per_program(num_heads: int) -> int:
    """Heads one program rotates (a power of two): 8, so that each program loads its token's
    cos/sin rows (and with a folded norm reads its stream) once for 8 heads, while a decode
    step's one token still spreads over several SMs."""
    return min(8, int(triton.next_power_of_2(num_heads)))


def rope_kv_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    norm_of: torch.Tensor | None = None,
    eps: float = 0.0,
    heads: int | None = None,
) -> torch.Tensor:
    """Rotated q as a new tensor; rotated k and v written to ``*_buffer[out_cache_loc]``;
    with ``norm_of`` (n, H), q, k and v first scaled by each token's inverse RMS of it.

    Slots are trusted (no bounds check; the pool's own writer checks them on the CPU).
    ``heads`` per program defaults to ``heads_per_program``.
    """
    # q: (n, Hq, D), k: (n, Hk, D), v: (n, Hk, Dv), any token/head strides, unit column stride;
    # cos, sin: (n, D) in q's dtype; out_cache_loc: (n,) int; k_buffer: (slots, Hk, D),
    # v_buffer: (slots, Hk, Dv) in the storage dtype -> q rotated: (n, Hq, D) contiguous
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, v_dim = k.shape[1], v.shape[2]
    if (
        head_dim % 2
        or k.shape != (num_tokens, num_kv_heads, head_dim)
        or v.shape[:2] != (num_tokens, num_kv_heads)
        or cos.shape != (num_tokens, head_dim)
        or sin.shape != cos.shape
        or out_cache_loc.shape != (num_tokens,)
        or k_buffer.shape[1:] != (num_kv_heads, head_dim)
        or v_buffer.shape[1:] != (num_kv_heads, v_dim)
    ):
        raise ValueError(
            f"rope_kv_store: shapes do not fit: q {tuple(q.shape)} k {tuple(k.shape)}"
            f" v {tuple(v.shape)} cos {tuple(cos.shape)} loc {tuple(out_cache_loc.shape)}"
            f" k_buffer {tuple(k_buffer.shape)} v_buffer {tuple(v_buffer.shape)}"
        )
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin, k_buffer, v_buffer)):
        raise ValueError("rope_kv_store needs a unit column stride everywhere")
    if cos.stride(0) != sin.stride(0):
        raise ValueError("cos and sin must share their row stride")
    if norm_of is not None and (norm_of.shape[0] != num_tokens or norm_of.stride(-1) != 1):
        raise ValueError(
            f"rope_kv_store: norm_of must be ({num_tokens}, H) with unit column stride, got"
            f" {tuple(norm_of.shape)} strides {norm_of.stride()}"
        )
    norm_width = 0 if norm_of is None else norm_of.shape[1]
    q_out = torch.empty(num_tokens, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    if v_buffer.dtype != k_buffer.dtype:
        raise ValueError(f"K and V buffers differ in dtype: {k_buffer.dtype}, {v_buffer.dtype}")
    if k_buffer.dtype in FP8_DTYPES:
        raise ValueError(
            f"rope_kv_store does not write {k_buffer.dtype} rows: fp8 pools store through "
            "set_kv_buffer (the compiled conversion rounds differently from torch's)"
        )
    num_heads = num_q_heads + num_kv_heads
    heads = heads_per_program(num_heads) if heads is None else heads
    if heads < 1 or heads & (heads - 1):
        raise ValueError(f"rope_kv_store: heads per program must be a power of two, got {heads}")
    _rope_kv_store_kernel[(num_tokens, triton.cdiv(num_heads, heads))](
        q,
        k,
        v,
        cos,
        sin,
        out_cache_loc,
        norm_of if norm_of is not None else q,  # never read without HAS_NORM
        q_out,
        k_buffer,
        v_buffer,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        norm_of.stride(0) if norm_of is not None else 0,
        q_out.stride(0),
        q_out.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        num_q_heads,
        num_kv_heads,
        head_dim // 2,
        v_dim,
        norm_width,
        eps,
        HEADS=heads,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        BLOCK_V=triton.next_power_of_2(v_dim),
        HAS_NORM=norm_of is not None,
        BLOCK_NORM=norm_block(norm_width),
        num_warps=4,
        enable_fp_fusion=False,  # no FMA: a product and the sum are rounded apart, as in torch
    )
    return q_out
