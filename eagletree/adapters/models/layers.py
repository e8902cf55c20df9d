"""Adapter: the building blocks every model here shares — RMSNorm, rotary embedding, SwiGLU MLP.

The arithmetic follows Hugging Face transformers operation for operation (norms in fp32, cos/sin
cast to the activation dtype), so that fp32 logits match it to rounding. With
``fused_kernels`` a block runs its Triton kernels instead (``adapters.kernels.triton``), which
round the same way; the torch code stays the reference and the CPU path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.tensor_parallel import SINGLE, RowParallelLinear, TensorParallel

if TYPE_CHECKING:
    from eagletree.domain.batch import ForwardBatch
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, fused_kernels: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.fused_kernels = fused_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden); the statistics are computed in fp32 whatever the input dtype
        if self.fused_kernels and x.dim() == 2 and x.stride(-1) == 1:
            return rmsnorm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``self(x)`` written into ``out`` (e.g. one half of a concatenation), returned."""
        # x, out: (num_tokens, hidden); out may be a column block of a wider tensor
        if self.fused_kernels and x.dim() == 2 and x.stride(-1) == 1:
            return rmsnorm(x, self.weight, self.eps, out)
        return out.copy_(self(x))

    def add(
        self, x: torch.Tensor, residual: torch.Tensor, reuse_residual: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the pre-norm residual stream's step.

        ``reuse_residual``: the caller owns ``residual``, so the sum may be written over it
        (the fused kernel does; the torch reference always returns a new tensor).
        """
        # x, residual: (num_tokens, hidden)
        if self.fused_kernels:
            out = None if reuse_residual else torch.empty_like(residual)
            return fused_add_rmsnorm(x, residual, self.weight, self.eps, out)
        summed = residual + x
        return self(summed), summed


def input_step(
    norm: RMSNorm | None, h: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's (attention input, residual stream): the stream is ``h`` for the first layer,
    ``residual + h`` after it."""
    if residual is None:
        return (h if norm is None else norm(h)), h
    if norm is None:
        raise ValueError("only a stack's first layer may skip its input norm")
    return norm.add(h, residual)


def fold_rms_weight(norm: RMSNorm, linear: nn.Linear) -> None:
    """Move ``norm``'s weight into the input columns of the ``linear`` that reads its output
    and set it to ones: ``linear(weight · n(x)) == linear'(n(x))`` for the unit-weight norm
    ``n``, and, a row's statistic being a scalar, ``linear'(n(x)) == rsqrt(mean(x²) + eps) ·
    linear'(x)`` — which lets a kernel after the GEMM apply the norm (``on_stream``)."""
    with torch.no_grad():
        folded = linear.weight.float() * norm.weight.float()[None, :]
        linear.weight.copy_(folded.to(linear.weight.dtype))
        norm.weight.fill_(1.0)


def concat_norms(first: RMSNorm, x: torch.Tensor, second: RMSNorm, y: torch.Tensor) -> torch.Tensor:
    """``cat((first(x), second(y)), -1)``; the fused kernels write their halves in place."""
    # x: (num_tokens, H1), y: (num_tokens, H2) -> (num_tokens, H1 + H2)
    if not first.fused_kernels:
        return torch.cat((first(x), second(y)), dim=-1)
    out = x.new_empty(x.shape[0], x.shape[1] + y.shape[1])
    first.into(x, out[:, : x.shape[1]])
    second.into(y, out[:, x.shape[1] :])
    return out


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, the MLP of Llama and of DeepSeek's dense layers, with
    gate and up merged into one GEMM (the checkpoint's ``gate_proj`` / ``up_proj``).

    Tensor-parallel: a rank holds its block of the intermediate features (gate/up rows, down
    columns); ``down_proj`` sums the ranks' partial outputs (one all-reduce)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool = False,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        parts = (("gate_proj", intermediate_size), ("up_proj", intermediate_size))
        self.gate_up_proj = MergedLinear(hidden_size, parts, bias=bias, tp=tp)
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=bias,
            tp=tp,
            what="intermediate_size",
            fused_kernels=fused_kernels,
        )
        self.fused_kernels = fused_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden); gate_up: (num_tokens, 2 * intermediate / W)
        gate_up = self.gate_up_proj(x)
        if self.fused_kernels:
            act = silu_and_mul(gate_up)
        else:
            gate, up = self.gate_up_proj.split(gate_up)
            act = nn.functional.silu(gate) * up
        out: torch.Tensor = self.down_proj(act)
        return out

    def runs_on_stream(self, num_tokens: int) -> bool:
        """Whether ``on_stream`` can run: fused kernels, down_proj streamed on one rank."""
        return self.fused_kernels and self.down_proj.adds_residual(num_tokens)

    def on_stream(self, stream: torch.Tensor, eps: float) -> torch.Tensor:
        """``stream + self(norm(stream))`` where the norm's weight is folded into gate/up:
        SiLU-and-mul applies the norm's statistic, down_proj's kernel adds the stream."""
        # stream: (num_tokens, hidden) -> (num_tokens, hidden)
        act = silu_and_mul(self.gate_up_proj(stream), stream, eps)
        return self.down_proj.product(act, residual=stream)


def rope_inverse_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq (dim // 2,) fp32 on CPU, factor applied to cos/sin) for a rotary width ``dim``."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_frequencies(rope, inv_freq), 1.0
    return _yarn_frequencies(rope, dim)


def _llama3_frequencies(rope: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    if rope.attention_factor is not None:
        attention_factor = rope.attention_factor
    elif rope.mscale and rope.mscale_all_dim:
        attention_factor = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(
            rope.factor, rope.mscale_all_dim
        )
    else:
        attention_factor = yarn_mscale(rope.factor)

    def correction_dim(num_rotations: float) -> float:
        ratio = rope.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return (dim * math.log(ratio)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, attention_factor


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given positions; ``interleaved`` selects DeepSeek's pairwise layout.

    ``inv_freq`` is a non-persistent buffer: after building a model on the meta device and
    ``to_empty``, call ``reset_parameters`` to compute it on the real device.
    """

    inv_freq: torch.Tensor

    def __init__(self, rope: RopeConfig, dim: int, interleaved: bool = False) -> None:
        super().__init__()
        self.rope = rope
        self.dim = dim
        self.interleaved = interleaved
        inv_freq, self.attention_factor = rope_inverse_frequencies(rope, dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> None:
        inv_freq, _ = rope_inverse_frequencies(self.rope, self.dim)
        with torch.no_grad():
            self.inv_freq = inv_freq.to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        # positions: (num_tokens,) -> cos, sin: (num_tokens, dim)
        freqs = positions[:, None].float() * self.inv_freq[None, :].float()
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = angles.cos() * self.attention_factor
        sin = angles.sin() * self.attention_factor
        return RopeTables(cos.to(dtype), sin.to(dtype), self.interleaved)


class RopeTables(NamedTuple):
    """The cos/sin rows of one forward's positions, computed once and used by every layer."""

    cos: torch.Tensor  # (num_tokens, dim)
    sin: torch.Tensor  # (num_tokens, dim)
    interleaved: bool

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate x: (num_tokens, num_heads, dim)."""
        cos, sin = self.cos[:, None, :], self.sin[:, None, :]
        half = x.shape[-1] // 2
        if not self.interleaved:
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
            return x * cos + rotated * sin
        # Pairs (x0, x1), (x2, x3), … each turned by one angle; the result is laid out
        # de-interleaved (even parts, then odd parts), as transformers does. q and k share the
        # permutation, so attention scores are exactly those of the interleaved rotation.
        half_cos, half_sin = cos[..., :half], sin[..., :half]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.cat((even * half_cos - odd * half_sin, odd * half_cos + even * half_sin), -1)


class AttentionContext(NamedTuple):
    """Where a layer's attention goes in one forward: the runner's backend, the batch and the
    runner's KV pool (the one the backend reads), so that a layer may store its new k/v
    itself — fused with RoPE — and call the backend with ``save_kv=False``."""

    backend: AttentionBackend
    batch: ForwardBatch
    kv_pool: KVPool | None = None


class PreNormDecoderLayer(nn.Module):
    """The block shared by the decoder layers: pre-norm attention and SwiGLU on a residual
    stream carried beside the layer output.

    ``forward(h, residual)`` -> (mlp output, residual): the stream after this layer is their
    sum, added by the next layer's input norm (or the final norm) in the same kernel. The first
    layer gets ``residual=None`` and ``h`` is the stream itself. A subclass sets the four
    parts; ``input_layernorm`` may be None on a stack's first layer.
    """

    input_layernorm: RMSNorm | None
    self_attn: nn.Module  # (x, rope, ctx) -> (num_tokens, hidden)
    post_attention_layernorm: RMSNorm
    mlp: SwiGLU

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        ctx: AttentionContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # h, residual: (num_tokens, hidden); the residual is this stack's own, updated in place
        x, residual = input_step(self.input_layernorm, h, residual)
        x, residual = self.post_attention_layernorm.add(self.self_attn(x, rope, ctx), residual)
        out: torch.Tensor = self.mlp(x)
        return out, residual
