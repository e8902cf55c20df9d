"""Triton: MLA's per-token prologue in one launch — RoPE of the query's rope part, RMSNorm of the
latent, RoPE of the rope key, and the pool row [latent; k_rope] written at ``out_cache_loc``.

What it replaces (``MLAAttention``'s torch path), operation for operation: ``kv_a_layernorm``
on the latent (fp32 statistics, cast, weight), ``RopeTables.rotate`` on q_rope and k_rope in
either layout (half-split, or DeepSeek's interleaved pairs written de-interleaved), and
``MLAKVPool.set_kv_buffer`` of ``cat(latent, k_rope)``. The rotated q_rope lands in the rope
columns of a new (tokens, heads, rank + rope) query whose latent columns the caller fills.
Grid (tokens, heads + 1): a program per query head, and one per token for its pool row. FMA
contraction is off so that products and sums round apart, as in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(src, cos_row, sin_row, half, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """One head's rotation as (first half, second half) of the de-interleaved result."""
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < half
    if INTERLEAVED:
        lo = tl.load(src + 2 * cols, mask=mask, other=0.0).to(tl.float32)
        hi = tl.load(src + 2 * cols + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        lo = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        hi = tl.load(src + half + cols, mask=mask, other=0.0).to(tl.float32)
    cos_lo = tl.load(cos_row + cols, mask=mask, other=0.0).to(tl.float32)
    cos_hi = tl.load(cos_row + half + cols, mask=mask, other=0.0).to(tl.float32)
    sin_lo = tl.load(sin_row + cols, mask=mask, other=0.0).to(tl.float32)
    sin_hi = tl.load(sin_row + half + cols, mask=mask, other=0.0).to(tl.float32)
    act = src.dtype.element_ty
    out_lo = ((lo * cos_lo).to(act).to(tl.float32) - (hi * sin_lo).to(act).to(tl.float32)).to(act)
    out_hi = ((hi * cos_hi).to(act).to(tl.float32) + (lo * sin_hi).to(act).to(tl.float32)).to(act)
    return out_lo, out_hi


@triton.jit
def _mla_rope_kv_store_kernel(
    q_rope_ptr,
    latent_ptr,
    k_rope_ptr,
    norm_weight_ptr,
    cos_ptr,
    sin_ptr,
    loc_ptr,
    q_out_ptr,
    kv_buf_ptr,
    stride_q_tok,
    stride_q_head,
    stride_latent,
    stride_k_rope,
    stride_rope,
    stride_q_out_tok,
    stride_q_out_head,
    stride_kv_slot,
    num_heads,
    rank,
    half,
    eps,
    INTERLEAVED: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_RANK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < half
    cos_row = cos_ptr + token * stride_rope
    sin_row = sin_ptr + token * stride_rope
    if head < num_heads:
        src = q_rope_ptr + token * stride_q_tok + head * stride_q_head
        out_lo, out_hi = _rotate(src, cos_row, sin_row, half, INTERLEAVED, BLOCK_HALF)
        dst = q_out_ptr + token * stride_q_out_tok + head * stride_q_out_head + rank
        tl.store(dst + cols, out_lo, mask=mask)
        tl.store(dst + half + cols, out_hi, mask=mask)
    else:
        slot = tl.load(loc_ptr + token).to(tl.int64)
        row = kv_buf_ptr + slot * stride_kv_slot
        store_ty = kv_buf_ptr.dtype.element_ty
        act = latent_ptr.dtype.element_ty
        r_cols = tl.arange(0, BLOCK_RANK)
        r_mask = r_cols < rank
        x = tl.load(latent_ptr + token * stride_latent + r_cols, mask=r_mask, other=0.0)
        x = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / rank + eps)
        weight = tl.load(norm_weight_ptr + r_cols, mask=r_mask, other=0.0).to(tl.float32)
        normed = ((x * rstd).to(act).to(tl.float32) * weight).to(act)
        tl.store(row + r_cols, normed.to(tl.float32).to(store_ty), mask=r_mask)
        src = k_rope_ptr + token * stride_k_rope
        out_lo, out_hi = _rotate(src, cos_row, sin_row, half, INTERLEAVED, BLOCK_HALF)
        tl.store(row + rank + cols, out_lo.to(tl.float32).to(store_ty), mask=mask)
        tl.store(row + rank + half + cols, out_hi.to(tl.float32).to(store_ty), mask=mask)


def mla_rope_kv_store(
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    out_cache_loc: torch.Tensor,
    kv_buffer: torch.Tensor,
) -> torch.Tensor:
    """A new query (tokens, heads, rank + rope) with the rotated q_rope in its rope columns
    (its latent columns left for the caller); the pool rows at ``out_cache_loc`` get
    [rmsnorm(latent); rotate(k_rope)] in the buffer's dtype. Slots are trusted."""
    # q_rope: (n, H, R) any token/head strides; latent: (n, rank), k_rope: (n, R) any row
    # stride; norm_weight: (rank,); cos, sin: (n, R); out_cache_loc: (n,);
    # kv_buffer: (slots, 1, rank + R), contiguous rows
    num_tokens, num_heads, rope_dim = q_rope.shape
    rank = latent.shape[1]
    if (
        rope_dim % 2
        or latent.shape[0] != num_tokens
        or k_rope.shape != (num_tokens, rope_dim)
        or norm_weight.shape != (rank,)
        or cos.shape != (num_tokens, rope_dim)
        or sin.shape != cos.shape
        or out_cache_loc.shape != (num_tokens,)
        or kv_buffer.shape[1:] != (1, rank + rope_dim)
    ):
        raise ValueError(
            f"mla_rope_kv_store: shapes do not fit: q_rope {tuple(q_rope.shape)} latent"
            f" {tuple(latent.shape)} k_rope {tuple(k_rope.shape)} cos {tuple(cos.shape)}"
            f" loc {tuple(out_cache_loc.shape)} kv_buffer {tuple(kv_buffer.shape)}"
        )
    if any(t.stride(-1) != 1 for t in (q_rope, latent, k_rope, cos, sin, kv_buffer)):
        raise ValueError("mla_rope_kv_store needs a unit column stride everywhere")
    if cos.stride(0) != sin.stride(0) or not kv_buffer[0].is_contiguous():
        raise ValueError("cos and sin must share their row stride; pool rows must be contiguous")
    q_out = torch.empty(
        num_tokens, num_heads, rank + rope_dim, dtype=q_rope.dtype, device=q_rope.device
    )
    if num_tokens == 0:
        return q_out
    _mla_rope_kv_store_kernel[(num_tokens, num_heads + 1)](
        q_rope,
        latent,
        k_rope,
        norm_weight,
        cos,
        sin,
        out_cache_loc,
        q_out,
        kv_buffer,
        q_rope.stride(0),
        q_rope.stride(1),
        latent.stride(0),
        k_rope.stride(0),
        cos.stride(0),
        q_out.stride(0),
        q_out.stride(1),
        kv_buffer.stride(0),
        num_heads,
        rank,
        rope_dim // 2,
        eps,
        INTERLEAVED=interleaved,
        BLOCK_HALF=triton.next_power_of_2(rope_dim // 2),
        BLOCK_RANK=triton.next_power_of_2(rank),
        num_warps=4,
        enable_fp_fusion=False,  # no FMA: a product and the sum are rounded apart, as in torch
    )
    return q_out
