"""Composition root, pools part: the slot allocator, the request table and the KV pools, the
attention backends over them, and the model runners (the target's, one per draft head).

``PoolProviders`` extends ``ModelProviders`` (``models.py``). A class body does not see the
names it inherits, so the models part's providers it builds on are named below (the same
objects: a container built from the class copies them once, with everything that uses them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
from eagletree.app import factories, sizing
from eagletree.app.container.models import ModelProviders

if TYPE_CHECKING:
    from eagletree.adapters.models.loading import DraftModel
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


# the models part's providers this part builds on
_config = ModelProviders.config
_device = ModelProviders.device
_dtype = ModelProviders.dtype
_target_model = ModelProviders.target_model
_target = ModelProviders.target
_speculative = ModelProviders.speculative
_draft_models = ModelProviders.draft_models
_max_running_requests = ModelProviders.max_running_requests
_max_context_len = ModelProviders.max_context_len


class PoolProviders(ModelProviders):
    """The models part, plus the memory, the attention backends and the runners over them."""

    # -- memory --------------------------------------------------------------------------------
    kv_mover = providers.Selector(
        _config.backend.kv_move,
        torch=providers.Singleton(TorchRowMover, debug_checks=_config.memory.debug_checks),
        triton=providers.Singleton(TritonRowMover, debug_checks=_config.memory.debug_checks),
    )
    slot_allocator = providers.Singleton(
        DeviceSlotAllocator,
        size=_config.memory.max_total_tokens,
        device=_device,
        debug_checks=_config.memory.debug_checks,
    )
    req_to_token_pool = providers.Singleton(
        TensorReqToTokenPool,
        max_requests=providers.Callable(sizing.req_to_token_rows, _max_running_requests),
        row_width=providers.Callable(
            sizing.req_to_token_row_width, _max_context_len, _speculative, _config.memory.page_size
        ),
        device=_device,
    )

    # KV pools of one kind; the layer dimensions come with the call (the target's, a draft's)
    mha_kv_pool = providers.Factory(
        MHAKVPool,
        size=_config.memory.max_total_tokens,
        dtype=_dtype,
        device=_device,
        mover=kv_mover,
        page_size=_config.memory.page_size,
        debug_checks=_config.memory.debug_checks,
    )
    mla_kv_pool = providers.Factory(
        MLAKVPool,
        size=_config.memory.max_total_tokens,
        dtype=_dtype,
        device=_device,
        mover=kv_mover,
        page_size=_config.memory.page_size,
        debug_checks=_config.memory.debug_checks,
    )
    dsa_kv_pool = providers.Factory(
        DSAKVPool,
        size=_config.memory.max_total_tokens,
        dtype=_dtype,
        device=_device,
        mover=kv_mover,
        page_size=_config.memory.page_size,
        debug_checks=_config.memory.debug_checks,
    )
    kv_pool = providers.Selector(
        _target.provided.attention_kind,
        mha=providers.Singleton(
            mha_kv_pool,
            layer_num=_target.provided.num_layers,
            kv_heads=_target.provided.num_kv_heads,
            head_dim=_target.provided.head_dim,
            v_head_dim=_target.provided.v_head_dim,
        ),
        mla=providers.Singleton(
            mla_kv_pool,
            layer_num=_target.provided.num_layers,
            kv_lora_rank=_target.provided.kv_lora_rank,
            qk_rope_head_dim=_target.provided.qk_rope_head_dim,
        ),
        dsa=providers.Singleton(
            dsa_kv_pool,
            layer_num=_target.provided.num_layers,
            kv_lora_rank=_target.provided.kv_lora_rank,
            qk_rope_head_dim=_target.provided.qk_rope_head_dim,
        ),
    )

    # -- attention: a backend over a given pool, and the target pool's ------------------------
    attention_backend_over = providers.Selector(
        _config.backend.attention,
        torch=providers.Factory(
            TorchAttentionBackend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=_max_running_requests,
        ),
        triton=providers.Factory(
            TritonAttentionBackend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=_max_running_requests,
        ),
        flash=providers.Factory(
            factories.flash_attention_backend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=_max_running_requests,
        ),
    )
    attention_backend = providers.Singleton(attention_backend_over, kv_pool=kv_pool)

    # -- runners: the target's, and one per draft head over a KV pool of the head's layout -----
    target_runner = providers.Singleton(
        TargetModelRunner,
        _target_model,
        kv_pool=kv_pool,
        req_to_token_pool=req_to_token_pool,
        attention_backend=attention_backend,
    )
    draft_runners = providers.Singleton(
        build_draft_runners,
        _draft_models,
        mha_kv_pool=mha_kv_pool.provider,
        mla_kv_pool=mla_kv_pool.provider,
        attention_backend_over=attention_backend_over.provider,
        req_to_token_pool=req_to_token_pool,
    )
