"""Adapter: Llama's GQA attention, in the two forms a model is built with — the torch reference,
whose backend stores the new KV, and the fused form, which stores it itself with RoPE.

Both take q, k and v from one GEMM (``qkv_proj``, filled from the checkpoint's q/k/v_proj) and
rotate them half-split (Llama's layout). ``llama_attention`` builds the form a model's
``fused_kernels`` selects; nothing chooses between them per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.tensor_parallel import SINGLE, RowParallelLinear, TensorParallel
from eagletree.domain.attention_layer import AttentionLayer

if TYPE_CHECKING:
    from eagletree.adapters.models.config import LlamaConfig
    from eagletree.adapters.models.layers import AttentionContext
    from eagletree.adapters.models.rotary import RopeTables
    from eagletree.ports.memory import MHAKVCache


class LlamaAttention(nn.Module):
    """GQA attention: RoPE through ``RopeTables.rotate``, the new k and v stored by the backend.
    ``input_size`` differs from hidden_size only in EAGLE-3's midlayer (2·H).

    Tensor-parallel: a rank owns ``heads / W`` query heads and ``kv_heads / W`` kv heads (its
    KV pool holds only those), and ``o_proj`` sums the ranks' head outputs (one all-reduce).
    """

    def __init__(
        self,
        config: LlamaConfig,
        layer_id: int,
        input_size: int | None = None,
        fused_kernels: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        heads, kv_heads, head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width = config.hidden_size if input_size is None else input_size
        bias = config.attention_bias
        parts = (
            ("q_proj", heads * head_dim),
            ("k_proj", kv_heads * head_dim),
            ("v_proj", kv_heads * head_dim),
        )
        self.qkv_proj = MergedLinear(width, parts, bias=bias, tp=tp)
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, bias=bias, tp=tp, fused_kernels=fused_kernels
        )
        self.layer = AttentionLayer(
            layer_id=layer_id,
            num_q_heads=tp.split(heads, "num_attention_heads"),
            num_kv_heads=tp.split(kv_heads, "num_key_value_heads"),
            head_dim=head_dim,
            v_head_dim=head_dim,
            scaling=head_dim**-0.5,
        )

    def forward(self, x: torch.Tensor, rope: RopeTables, ctx: AttentionContext) -> torch.Tensor:
        # x: (num_tokens, width) -> (num_tokens, hidden)
        q, k, v = self._heads(x)
        q, k = rope.rotate(q), rope.rotate(k)
        # o: (num_tokens, num_q_heads * head_dim)
        o = ctx.backend.forward(q, k, v, self.layer, ctx.batch)
        out: torch.Tensor = self.o_proj(o)
        return out

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: (num_tokens, width) -> q (n, Hq, D), k, v (n, Hk, D): strided views of one GEMM
        layer, num_tokens = self.layer, x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        return (
            q.view(num_tokens, layer.num_q_heads, layer.head_dim),
            k.view(num_tokens, layer.num_kv_heads, layer.head_dim),
            v.view(num_tokens, layer.num_kv_heads, layer.head_dim),
        )


class FusedLlamaAttention(LlamaAttention):
    """``LlamaAttention`` whose RoPE and KV store are one kernel (``rope_kv_store``): it writes
    the rotated k and the v rows into the runner's MHA pool at ``out_cache_loc`` and runs the
    backend with ``save_kv=False``. The pool must take such writes (not fp8, slots not
    translated), which the runner checks when it is built (``MHALayout.direct_writes``)."""

    def forward(self, x: torch.Tensor, rope: RopeTables, ctx: AttentionContext) -> torch.Tensor:
        # x: (num_tokens, width) -> (num_tokens, hidden)
        q, k, v = self._heads(x)
        out: torch.Tensor = self.o_proj(self._store_and_attend(q, k, v, rope, ctx))
        return out

    def on_stream(
        self, stream: torch.Tensor, rope: RopeTables, ctx: AttentionContext, eps: float | None
    ) -> torch.Tensor:
        """``stream + self(norm(stream))`` where the norm's weight is folded into ``qkv_proj``
        (``eps`` None: no norm, as on an EAGLE head's first layer): the RoPE kernel applies
        the norm's statistic to q, k and v, and o_proj's kernel adds the stream. Only for the
        rows o_proj streams (a stream layer's)."""
        # stream: (num_tokens, hidden) -> (num_tokens, hidden)
        q, k, v = self._heads(stream)
        norm_of = None if eps is None else stream
        o = self._store_and_attend(q, k, v, rope, ctx, norm_of, eps or 0.0)
        return self.o_proj.product(o, residual=stream)

    def _store_and_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables,
        ctx: AttentionContext,
        norm_of: torch.Tensor | None = None,
        eps: float = 0.0,
    ) -> torch.Tensor:
        # q (n, Hq, D), k, v (n, Hk, D) -> o (n, Hq·D): RoPE and the KV store in one kernel
        pool: MHAKVCache = ctx.kv_pool  # type: ignore[assignment]
        layer_id = self.layer.layer_id
        keys, values = pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)
        loc = ctx.batch.out_cache_loc
        q = rope_kv_store(q, k, v, rope.cos, rope.sin, loc, keys, values, norm_of, eps)
        # k, v are ignored with save_kv=False: the backend reads every key from the pool
        return ctx.backend.forward(q, k, v, self.layer, ctx.batch, save_kv=False)


def llama_attention(
    config: LlamaConfig,
    layer_id: int,
    input_size: int | None = None,
    fused_kernels: bool = False,
    tp: TensorParallel = SINGLE,
) -> LlamaAttention:
    """The attention of a Llama block: fused (it stores its own KV) or the reference."""
    kind = FusedLlamaAttention if fused_kernels else LlamaAttention
    return kind(config, layer_id, input_size, fused_kernels, tp)
