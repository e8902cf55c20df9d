"""Adapter: a linear layer's product — torch's GEMM, or the weight-stream kernel for the few rows
of a decode step — chosen when the layer is built.

``skinny_gemm`` reads each weight row once for all of a decode step's rows and adds a residual
inside the kernel; above ``MAX_ROWS`` rows cuBLAS's tiles win. A layer built with fused kernels
holds ``WeightStreamProduct``, whose one per-call rule is that row count (and the kernel's input
layout); a layer built without holds ``TorchProduct``, which asks nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from eagletree.adapters.kernels.triton.skinny_gemm import MAX_ROWS, skinny_gemm


class TorchProduct:
    """``x @ weight.T`` (+ bias) (+ residual) through torch, for every input."""

    __slots__ = ()

    def streams(self, x: torch.Tensor) -> bool:
        return False

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        copy_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # x: (num_tokens, in), weight: (out, in), residual, copy_to: (num_tokens, out)
        # -> (num_tokens, out)
        y = nn.functional.linear(x, weight, bias)
        y = y if residual is None else y + residual
        if copy_to is not None:
            copy_to.copy_(y)
        return y


class WeightStreamProduct(TorchProduct):
    """The weight-stream kernel for at most ``MAX_ROWS`` rows of unit column stride (a decode
    step's), the residual added in the kernel; torch's product for anything else."""

    __slots__ = ()

    def streams(self, x: torch.Tensor) -> bool:
        return x.shape[0] <= MAX_ROWS and x.dim() == 2 and x.stride(-1) == 1

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        copy_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.streams(x):
            return skinny_gemm(x, weight, bias, residual=residual, copy_to=copy_to)
        return super().__call__(x, weight, bias, residual, copy_to)


class StreamedLinear(nn.Linear):
    """``nn.Linear`` whose product is ``gemm``'s: the weight-stream kernel for a decode step's
    rows when built with ``fused_kernels`` (``WeightStreamProduct``), torch's otherwise."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, fused_kernels: bool
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.gemm = WeightStreamProduct() if fused_kernels else TorchProduct()

    def streams(self, x: torch.Tensor) -> bool:
        """Whether ``product(x)`` runs the weight-stream kernel."""
        return self.gemm.streams(x)

    def product(
        self,
        x: torch.Tensor,
        with_bias: bool = True,
        residual: torch.Tensor | None = None,
        copy_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T`` (+ bias) (+ ``residual``, added inside the weight-stream kernel),
        also written into ``copy_to`` (by the weight-stream kernel's own store)."""
        # x: (num_tokens, in), residual, copy_to: (num_tokens, out) -> (num_tokens, out)
        bias = self.bias if with_bias else None
        return self.gemm(x, self.weight, bias, residual, copy_to)
