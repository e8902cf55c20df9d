"""Adapter: rotary position embedding — inverse frequencies for each supported scaling
(default, linear, Llama 3, YaRN), one forward's cos/sin tables, and the rotation of q and k.

The arithmetic follows Hugging Face transformers operation for operation (frequencies in fp32,
cos/sin cast to the activation dtype), so that fp32 logits match it to rounding. Built with
``fused_kernels`` the tables come from one Triton kernel (``kernels/triton/rope_tables.py``),
which rounds the same way; the torch code stays the reference and the CPU path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from eagletree.adapters.kernels.triton.rope_tables import rope_tables
from eagletree.adapters.models.config import RopeConfig


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


TablesMaker = Callable[
    [torch.Tensor, torch.Tensor, float, torch.dtype], tuple[torch.Tensor, torch.Tensor]
]


def fused_tables(
    positions: torch.Tensor, column_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of ``positions`` × ``column_freq``, times the attention factor, in ``dtype``:
    one ``rope_tables`` launch."""
    tables = rope_tables(positions, column_freq.float(), attention_factor, dtype)
    return tables[0], tables[1]


def torch_tables(
    positions: torch.Tensor, column_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of ``fused_tables``: four kernels a forward (a tree step runs six
    forwards): the product promotes the positions itself, cos and sin write into one buffer,
    one cast; an attention factor of 1 multiplies nothing. The same values as casting each
    table on its own."""
    # positions: (num_tokens,) -> cos, sin: (num_tokens, dim)
    angles = positions[:, None] * column_freq.float()[None, :]
    tables = torch.empty((2, *angles.shape), dtype=angles.dtype, device=angles.device)
    torch.cos(angles, out=tables[0])
    torch.sin(angles, out=tables[1])
    if attention_factor != 1.0:
        tables.mul_(attention_factor)
    cos, sin = tables.to(dtype)
    return cos, sin


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given positions; ``interleaved`` selects DeepSeek's pairwise layout.

    ``column_freq`` (dim,), the inverse frequency of every table column (both halves), is a
    non-persistent buffer: after building a model on the meta device and ``to_empty``, call
    ``reset_parameters`` to compute it on the real device. Built with ``fused_kernels`` it
    makes the tables with one Triton launch (``fused_tables``) instead of the torch path's four
    (``torch_tables``).
    """

    column_freq: torch.Tensor

    def __init__(
        self, rope: RopeConfig, dim: int, interleaved: bool = False, *, fused_kernels: bool = False
    ) -> None:
        super().__init__()
        self.rope = rope
        self.dim = dim
        self.interleaved = interleaved
        self.fused_kernels = fused_kernels
        self.tables: TablesMaker = fused_tables if fused_kernels else torch_tables
        inv_freq, self.attention_factor = rope_inverse_frequencies(rope, dim)
        self.register_buffer("column_freq", torch.cat((inv_freq, inv_freq)), persistent=False)

    def reset_parameters(self) -> None:
        inv_freq, _ = rope_inverse_frequencies(self.rope, self.dim)
        with torch.no_grad():
            self.column_freq = torch.cat((inv_freq, inv_freq)).to(self.column_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        # positions: (num_tokens,) -> cos, sin: (num_tokens, dim), views of one (2, n, dim)
        cos, sin = self.tables(positions, self.column_freq, self.attention_factor, dtype)
        return RopeTables(cos, sin, self.interleaved)


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
