"""Adapter: the building blocks every model here shares — RMSNorm, SwiGLU MLP, the pre-norm layer.

The arithmetic follows Hugging Face transformers operation for operation (norms in fp32), so
that fp32 logits match it to rounding. A block built with ``fused_kernels`` holds the Triton
kernels' variant instead (``FusedRMSNorm``, SwiGLU's ``silu_and_mul``; ``adapters.kernels.triton``),
which round the same way; the torch code stays the reference and the CPU path. The rotary
embedding the layers take is in ``models/rotary.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.tensor_parallel import SINGLE, RowParallelLinear, TensorParallel

if TYPE_CHECKING:
    from eagletree.adapters.models.rotary import RopeTables
    from eagletree.domain.batch import ForwardBatch
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool


class RMSNorm(nn.Module):
    """The torch reference: statistics in fp32, the normalised row cast to the input dtype
    before the weight multiplies it (transformers' ``LlamaRMSNorm``). ``rms_norm`` builds it
    or ``FusedRMSNorm``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden); the statistics are computed in fp32 whatever the input dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``self(x)`` written into ``out`` (e.g. one half of a concatenation), returned."""
        # x, out: (num_tokens, hidden); out may be a column block of a wider tensor
        return out.copy_(self(x))

    def add(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        reuse_residual: bool = True,
        copy_to: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the pre-norm residual stream's step.

        ``reuse_residual``: the caller owns ``residual``, so the sum may be written over it
        (the fused kernel does; the torch reference always returns a new tensor). ``copy_to``
        gets the sum too (the fused kernel stores it there itself).
        """
        # x, residual, copy_to: (num_tokens, hidden)
        summed = residual + x
        if copy_to is not None:
            copy_to.copy_(summed)
        return self(summed), summed

    def concat(self, x: torch.Tensor, second: RMSNorm, y: torch.Tensor) -> torch.Tensor:
        """``cat((self(x), second(y)), -1)``; ``second`` is built as this norm is."""
        # x: (num_tokens, H1), y: (num_tokens, H2) -> (num_tokens, H1 + H2)
        return torch.cat((self(x), second(y)), dim=-1)


class FusedRMSNorm(RMSNorm):
    """``RMSNorm`` through the Triton kernels, which round as the reference does: one launch
    per norm, the residual add fused in, a concatenation's halves written in place. An input
    the kernel cannot read (not 2-D, or a column stride other than 1) takes the reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.stride(-1) == 1:
            return rmsnorm(x, self.weight, self.eps)
        return super().forward(x)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.stride(-1) == 1:
            return rmsnorm(x, self.weight, self.eps, out)
        return super().into(x, out)

    def add(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        reuse_residual: bool = True,
        copy_to: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = None if reuse_residual else torch.empty_like(residual)
        return fused_add_rmsnorm(x, residual, self.weight, self.eps, out, copy_to=copy_to)

    def concat(self, x: torch.Tensor, second: RMSNorm, y: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(x.shape[0], x.shape[1] + y.shape[1])
        self.into(x, out[:, : x.shape[1]])
        second.into(y, out[:, x.shape[1] :])
        return out


def rms_norm(hidden_size: int, eps: float, fused_kernels: bool) -> RMSNorm:
    """The norm a block built with (or without) ``fused_kernels`` holds."""
    return FusedRMSNorm(hidden_size, eps) if fused_kernels else RMSNorm(hidden_size, eps)


def input_step(
    norm: RMSNorm | None,
    h: torch.Tensor,
    residual: torch.Tensor | None,
    copy_to: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's (attention input, residual stream): the stream is ``h`` for the first layer,
    ``residual + h`` after it; also stored into ``copy_to`` (by the norm's kernel after the
    first layer)."""
    if residual is None:
        if copy_to is not None:
            copy_to.copy_(h)
        return (h if norm is None else norm(h)), h
    if norm is None:
        raise ValueError("only a stack's first layer may skip its input norm")
    return norm.add(h, residual, copy_to=copy_to)


def fold_rms_weight(norm: RMSNorm, linear: nn.Linear) -> None:
    """Move ``norm``'s weight into the input columns of the ``linear`` that reads its output
    and set it to ones: ``linear(weight · n(x)) == linear'(n(x))`` for the unit-weight norm
    ``n``, and, a row's statistic being a scalar, ``linear'(n(x)) == rsqrt(mean(x²) + eps) ·
    linear'(x)`` — which lets a kernel after the GEMM apply the norm (``on_stream``)."""
    with torch.no_grad():
        folded = linear.weight.float() * norm.weight.float()[None, :]
        linear.weight.copy_(folded.to(linear.weight.dtype))
        norm.weight.fill_(1.0)


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
        # silu(gate) * up: one kernel, or the torch reference
        self.activation: Callable[[torch.Tensor], torch.Tensor] = (
            silu_and_mul if fused_kernels else silu_times_up
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden); gate_up: (num_tokens, 2 * intermediate / W)
        out: torch.Tensor = self.down_proj(self.activation(self.gate_up_proj(x)))
        return out

    def on_stream(
        self, stream: torch.Tensor, eps: float, copy_to: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``stream + self(norm(stream))`` where the norm's weight is folded into gate/up:
        SiLU-and-mul applies the norm's statistic, down_proj's kernel adds the stream (and
        stores the result into ``copy_to`` too). Only for an MLP built with fused kernels, of
        rows down_proj streams (a stream layer's)."""
        # stream, copy_to: (num_tokens, hidden) -> (num_tokens, hidden)
        act = silu_and_mul(self.gate_up_proj(stream), stream, eps)
        return self.down_proj.product(act, residual=stream, copy_to=copy_to)


def silu_times_up(gate_up: torch.Tensor) -> torch.Tensor:
    """The torch reference of ``silu_and_mul``: ``silu(gate) * up`` of the two halves."""
    # gate_up: (num_tokens, 2 * intermediate) -> (num_tokens, intermediate)
    gate, up = gate_up.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


class AttentionContext(NamedTuple):
    """Where a layer's attention goes in one forward: the runner's backend, the batch and the
    runner's KV pool (the one the backend reads). A layer built with fused kernels writes its
    new k/v rows into that pool itself — fused with RoPE — and calls the backend with
    ``save_kv=False``; the runner checked, when it was built, that the pool takes them."""

    backend: AttentionBackend
    batch: ForwardBatch
    kv_pool: KVPool


class PreNormDecoderLayer(nn.Module):
    """The block shared by the decoder layers: pre-norm attention and SwiGLU on a residual
    stream carried beside the layer output.

    ``forward(h, residual)`` -> (mlp output, residual): the stream after this layer is their
    sum, added by the next layer's input norm (or the final norm) in the same kernel. The first
    layer gets ``residual=None`` and ``h`` is the stream itself. ``input_layernorm`` may be
    None on a stack's first layer; ``self_attn`` maps (x, rope, ctx) to (num_tokens, hidden).
    """

    def __init__(
        self,
        input_layernorm: RMSNorm | None,
        self_attn: nn.Module,
        post_attention_layernorm: RMSNorm,
        mlp: SwiGLU,
    ) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.post_attention_layernorm = post_attention_layernorm
        self.mlp = mlp

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        ctx: AttentionContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # h, residual: (num_tokens, hidden); the residual is this stack's own, updated in place
        out, residual, _ = self.forward_copying(h, residual, rope, ctx, None, None)
        return out, residual

    def forward_copying(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        ctx: AttentionContext,
        input_to: torch.Tensor | None,
        output_to: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """``forward``, also storing the stream entering the layer into ``input_to`` and,
        where a kernel of the layer produces the stream leaving it, that one into
        ``output_to`` (then True); both (num_tokens, hidden), any row stride (EAGLE-3's
        captures). Each is stored by the kernel that computes the stream, where one does,
        saving a copy's launch. This layer hands its stream on as a pair (mlp output,
        residual), which the next layer's input norm adds: no kernel here produces it."""
        x, residual = input_step(self.input_layernorm, h, residual, input_to)
        x, residual = self.post_attention_layernorm.add(self.self_attn(x, rope, ctx), residual)
        out: torch.Tensor = self.mlp(x)
        return out, residual, False
