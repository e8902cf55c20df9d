"""Adapter: linear layers whose decode-step product can take the weight-stream kernel, and FP8
weights for a draft head's layers.

``StreamedLinear`` multiplies the few rows of a decode step with ``skinny_gemm`` (one pass over
the weight, no split-K reduction) when ``fused_kernels`` is set; larger inputs go to cuBLAS.
``PlainLinear`` keeps its own dtype's product on cuBLAS at every row count: its wide weights
(merged q/k/v and gate/up, a head's fc) stream no faster through the kernel than cuBLAS reads
them (benchmarks.md).

FP8 (e4m3, one fp32 scale per output row, ``quantize_fp8``) halves the bytes a layer reads per
decode step. It is offered for draft heads only: a draft's rounding changes which tokens it
proposes, never which ones the bf16 target accepts, so decoding stays lossless and only the
acceptance can move. An FP8 layer takes the kernel up to ``FP8_MAX_ROWS`` rows whatever its
class (cuBLAS cannot read the weight as stored); above that, or without the kernels, it
multiplies by a widened copy of the weight (prefill, the CPU reference).
"""

from __future__ import annotations

import torch
from torch import nn

from eagletree.adapters.kernels.triton.skinny_gemm import FP8_MAX_ROWS, MAX_ROWS, skinny_gemm

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> (FP8 weight (N, K), fp32 scales (N,)): each row divided by its largest
    magnitude over ``FP8_MAX`` (an all-zero row keeps scale 1)."""
    # weight: (N, K) -> (N, K) float8_e4m3fn, (N,) float32
    amax = weight.detach().float().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scaled = weight.detach().float() / scale[:, None]
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequantize_rows(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The widened weight ``quantize_rows`` stands for, in ``dtype``."""
    return (weight.float() * scale[:, None]).to(dtype)


class StreamedLinear(nn.Linear):
    """``nn.Linear`` whose product takes the weight-stream kernel for a decode step's rows."""

    fused_kernels: bool = False

    @property
    def weight_scale(self) -> torch.Tensor | None:
        """The rows' fp32 scales of an FP8 weight; None for a weight in the model's dtype."""
        return self._buffers.get("fp8_scale")

    def quantize_fp8(self, fused_kernels: bool) -> None:
        """Store the weight as FP8 with one scale per output row (inference only: the weight
        stops being a trainable parameter); ``fused_kernels``: whether the kernel multiplies it."""
        weight, scale = quantize_rows(self.weight)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer("fp8_scale", scale)
        self.fused_kernels = fused_kernels

    def streams(self, x: torch.Tensor) -> bool:
        """Whether ``product(x)`` runs the weight-stream kernel."""
        return self.streams_rows(x.shape[0]) and x.dim() == 2 and x.stride(-1) == 1

    def streams_rows(self, rows: int) -> bool:
        limit = FP8_MAX_ROWS if self.weight_scale is not None else MAX_ROWS
        return self.fused_kernels and rows <= limit

    def product(
        self, x: torch.Tensor, with_bias: bool = True, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ weight.T`` (+ bias) (+ ``residual``, added inside the weight-stream kernel)."""
        # x: (num_tokens, in), residual: (num_tokens, out) -> (num_tokens, out)
        bias = self.bias if with_bias else None
        scale = self.weight_scale
        if self.streams(x):
            return skinny_gemm(x, self.weight, bias, residual=residual, weight_scale=scale)
        weight = self.weight if scale is None else dequantize_rows(self.weight, scale, x.dtype)
        y = nn.functional.linear(x, weight, bias)
        return y if residual is None else y + residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in) -> (num_tokens, out)
        return self.product(x)


class PlainLinear(StreamedLinear):
    """A linear layer on cuBLAS in its own dtype at every row count; an FP8 weight still takes
    the kernel."""

    def streams_rows(self, rows: int) -> bool:
        return self.weight_scale is not None and super().streams_rows(rows)


def quantize_fp8(model: nn.Module, fused_kernels: bool) -> int:
    """Every linear layer of ``model`` to FP8; returns how many were converted. A draft's
    borrowed target embedding and lm_head are not among its modules (``SharedTargetModules``
    keeps them unregistered), so the target stays exact."""
    converted = 0
    for module in model.modules():
        if isinstance(module, StreamedLinear):
            module.quantize_fp8(fused_kernels)
            converted += 1
    return converted
