"""Composition root, pools part: the slot allocator, the request table and the KV pools, the
attention backends over them, and the model runners (the target's, one per draft head).

``PoolProviders`` extends ``ModelProviders`` (``models.py``); ``Container`` extends it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dependency_injector import providers

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.stack import MHALayout
from eagletree.app.composition import factories, sizing
from eagletree.app.composition.model_providers import ModelProviders

if TYPE_CHECKING:
    from eagletree.adapters.models.draft_loading import DraftModel
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool, ReqToTokenPool


def build_draft_runners(
    heads: Sequence[DraftModel],
    *,
    mha_kv_pool: Callable[..., KVPool],
    mla_kv_pool: Callable[..., KVPool],
    attention_backend_over: Callable[..., AttentionBackend],
    req_to_token_pool: ReqToTokenPool,
) -> list[DraftModelRunner]:
    """A runner per head over a KV pool of its own layout (the target pool's size), sharing
    the target's req_to_token table (and through it the slot allocator's slot ids)."""
    runners = []
    for head in heads:
        layout = head.kv_layout
        if isinstance(layout, MHALayout):
            pool = mha_kv_pool(
                layer_num=layout.layer_num,
                kv_heads=layout.kv_heads,
                head_dim=layout.head_dim,
                v_head_dim=layout.v_head_dim,
            )
        else:
            pool = mla_kv_pool(
                layer_num=layout.layer_num,
                kv_lora_rank=layout.kv_lora_rank,
                qk_rope_head_dim=layout.qk_rope_head_dim,
            )
        backend = attention_backend_over(kv_pool=pool)
        runners.append(
            DraftModelRunner(
                head, kv_pool=pool, req_to_token_pool=req_to_token_pool, attention_backend=backend
            )
        )
    return runners


def _kv_pool_factory(
    pool: Callable[..., KVPool], mover: providers.Provider[Any]
) -> providers.Factory[KVPool]:
    """Pools of one kind: the shared size, dtype, device, mover and page size; the layer
    dimensions come with each call (the target's, a draft's)."""
    memory = ModelProviders.config.memory
    return providers.Factory(
        pool,
        size=memory.max_total_tokens,
        dtype=ModelProviders.dtype,
        device=ModelProviders.device,
        mover=mover,
        page_size=memory.page_size,
        debug_checks=memory.debug_checks,
    )


def _latent_target_pool(pool_factory: providers.Factory[KVPool]) -> providers.Singleton[KVPool]:
    """The target's pool of a latent-attention kind (MLA, DSA), from its description."""
    target = ModelProviders.target.provided
    return providers.Singleton(
        pool_factory,
        layer_num=target.num_layers,
        kv_lora_rank=target.kv_lora_rank,
        qk_rope_head_dim=target.qk_rope_head_dim,
    )


def _attention_backend_factory(
    backend: Callable[..., AttentionBackend], req_to_token_pool: providers.Provider[Any]
) -> providers.Factory[AttentionBackend]:
    """Backends of one kind over the request table, sized for the running requests; the KV
    pool comes with each call."""
    return providers.Factory(
        backend,
        req_to_token_pool=req_to_token_pool,
        max_batch_size=ModelProviders.max_running_requests,
    )


class PoolProviders(ModelProviders):
    """The models part, plus the memory, the attention backends and the runners over them.

    A class body does not see the names it inherits: the models part's providers are named
    ``ModelProviders.<name>`` (the same objects, which a container built from this class copies
    once, with everything that uses them)."""

    # -- memory --------------------------------------------------------------------------------
    kv_mover = providers.Selector(
        ModelProviders.config.backend.kv_move,
        torch=providers.Singleton(
            TorchRowMover, debug_checks=ModelProviders.config.memory.debug_checks
        ),
        triton=providers.Singleton(
            TritonRowMover, debug_checks=ModelProviders.config.memory.debug_checks
        ),
    )
    slot_allocator = providers.Singleton(
        DeviceSlotAllocator,
        size=ModelProviders.config.memory.max_total_tokens,
        device=ModelProviders.device,
        debug_checks=ModelProviders.config.memory.debug_checks,
    )
    req_to_token_pool = providers.Singleton(
        TensorReqToTokenPool,
        max_requests=providers.Callable(
            sizing.req_to_token_rows, ModelProviders.max_running_requests
        ),
        row_width=providers.Callable(
            sizing.req_to_token_row_width,
            ModelProviders.max_context_len,
            ModelProviders.speculative,
            ModelProviders.config.memory.page_size,
            ModelProviders.shape_policy.provided.shapes,
        ),
        device=ModelProviders.device,
    )

    # KV pools of one kind; the layer dimensions come with the call (the target's, a draft's)
    mha_kv_pool = _kv_pool_factory(MHAKVPool, kv_mover)
    mla_kv_pool = _kv_pool_factory(MLAKVPool, kv_mover)
    dsa_kv_pool = _kv_pool_factory(DSAKVPool, kv_mover)
    kv_pool = providers.Selector(
        ModelProviders.target.provided.attention_kind,
        mha=providers.Singleton(
            mha_kv_pool,
            layer_num=ModelProviders.target.provided.num_layers,
            kv_heads=ModelProviders.target.provided.num_kv_heads,
            head_dim=ModelProviders.target.provided.head_dim,
            v_head_dim=ModelProviders.target.provided.v_head_dim,
        ),
        mla=_latent_target_pool(mla_kv_pool),
        dsa=_latent_target_pool(dsa_kv_pool),
    )

    # -- attention: a backend over a given pool, and the target pool's ------------------------
    attention_backend_over = providers.Selector(
        ModelProviders.config.backend.attention,
        torch=_attention_backend_factory(TorchAttentionBackend, req_to_token_pool),
        triton=_attention_backend_factory(TritonAttentionBackend, req_to_token_pool),
        flash=_attention_backend_factory(factories.flash_attention_backend, req_to_token_pool),
    )
    attention_backend = providers.Singleton(attention_backend_over, kv_pool=kv_pool)

    # -- runners: the target's, and one per draft head over a KV pool of the head's layout -----
    target_runner = providers.Singleton(
        TargetModelRunner,
        ModelProviders.target_model,
        kv_pool=kv_pool,
        req_to_token_pool=req_to_token_pool,
        attention_backend=attention_backend,
    )
    draft_runners = providers.Singleton(
        build_draft_runners,
        ModelProviders.draft_models,
        mha_kv_pool=mha_kv_pool.provider,
        mla_kv_pool=mla_kv_pool.provider,
        attention_backend_over=attention_backend_over.provider,
        req_to_token_pool=req_to_token_pool,
    )
