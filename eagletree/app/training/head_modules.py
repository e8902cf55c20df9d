"""App: plain-torch building blocks of trainable draft heads, under the HF parameter names.

Training runs whole sequences with an explicit attention mask (SDPA) instead of the engine's
KV pool, so these modules are separate from the inference ones; their parameter names are the
checkpoint's (``q_proj``, ``gate_proj``, ``input_layernorm``, …), so a state dict saves as is.
The arithmetic matches the inference modules (norm statistics in fp32, rotate-half rope).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional


class HeadShape(NamedTuple):
    """Dimensions of a draft head's decoder layer (those of the target)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rope(NamedTuple):
    cos: torch.Tensor  # (seq_len, head_dim)
    sin: torch.Tensor  # (seq_len, head_dim)

    @staticmethod
    def of(seq_len: int, head_dim: int, theta: float, device: torch.device) -> Rope:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1.0 / (theta ** (exponents / head_dim))
        freqs = torch.arange(seq_len, device=device).float()[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return Rope(angles.cos(), angles.sin())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        # x: (batch, heads, seq_len, head_dim)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos.to(x.dtype) + rotated * self.sin.to(x.dtype)


class KVCache:
    """The keys and values of every unrolled step so far, for one layer."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []


class Attention(nn.Module):
    """GQA attention over the current step's rows and the cached rows of earlier steps."""

    def __init__(self, shape: HeadShape, input_size: int) -> None:
        super().__init__()
        self.shape = shape
        width = shape.num_heads * shape.head_dim
        kv_width = shape.num_kv_heads * shape.head_dim
        self.q_proj = nn.Linear(input_size, width, bias=False)
        self.k_proj = nn.Linear(input_size, kv_width, bias=False)
        self.v_proj = nn.Linear(input_size, kv_width, bias=False)
        self.o_proj = nn.Linear(width, shape.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rope, cache: KVCache, mask: torch.Tensor
    ) -> torch.Tensor:
        # x: (batch, seq_len, input_size); mask: (seq_len, (steps so far + 1) * seq_len) bool
        batch, seq_len, _ = x.shape
        shape = self.shape
        q = self.q_proj(x).view(batch, seq_len, shape.num_heads, shape.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, shape.num_kv_heads, shape.head_dim)
        v = self.v_proj(x).view(batch, seq_len, shape.num_kv_heads, shape.head_dim)
        cache.keys.append(rope.rotate(k.transpose(1, 2)))
        cache.values.append(v.transpose(1, 2))
        keys, values = torch.cat(cache.keys, dim=2), torch.cat(cache.values, dim=2)
        groups = shape.num_heads // shape.num_kv_heads
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        o = functional.scaled_dot_product_attention(rope.rotate(q), keys, values, attn_mask=mask)
        # o: (batch, heads, seq_len, head_dim) -> (batch, seq_len, hidden)
        out: torch.Tensor = self.o_proj(o.transpose(1, 2).reshape(batch, seq_len, -1))
        return out


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


def init_linear_weights(module: nn.Module, std: float) -> None:
    """Normal(0, std) weights and zero biases for every Linear (HF's initialiser)."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=std)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
