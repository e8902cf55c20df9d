"""Composition root: the only module that names concrete adapters.

Settings are resolved once (``resolve_speculative``) and poured, with the target description
and the derived pool sizes, into a strict ``Configuration``; ``Selector``s pick adapters by
name and only the selected branch is ever built. Tests swap providers with ``override``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from dependency_injector import containers, providers

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.kernels.triton import beam_step as triton_beam_step
from eagletree.adapters.kernels.triton import coins as triton_coins
from eagletree.adapters.kernels.triton import compaction as triton_compaction
from eagletree.adapters.kernels.triton import draft_topk as triton_draft_topk
from eagletree.adapters.kernels.triton import tree_build as triton_tree_build
from eagletree.adapters.kernels.triton import tree_verify as triton_tree_verify
from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app import factories
from eagletree.app.platform import resolve_platform
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.config.eagle_hook import ResolvedSpeculative, resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription

# Slack past the v2 window, as upstream's "+ 4": the bonus token and an off-by-one at the limit.
ROW_HEADROOM = 4


class Container(containers.DeclarativeContainer):
    """Providers of one engine's target-side memory and attention; see ``build_container``."""

    config = providers.Configuration(strict=True)
    target = providers.Dependency(instance_of=TargetDescription)
    speculative = providers.Dependency(instance_of=ResolvedSpeculative)

    # The worker the engine will run; issue 7 turns this into a Selector over worker classes.
    worker_name = providers.Callable(str, config.speculative.resolved.worker)

    device = providers.Singleton(torch.device, config.model.device)
    dtype = providers.Callable(factories.torch_dtype, config.model.dtype)

    kv_mover = providers.Selector(
        config.backend.kv_move,
        torch=providers.Singleton(TorchRowMover),
        triton=providers.Singleton(TritonRowMover),
    )

    slot_allocator = providers.Singleton(
        DeviceSlotAllocator,
        size=config.memory.max_total_tokens,
        device=device,
        debug_checks=False,
    )

    # a step's fused device functions: one Triton launch each on CUDA, the torch references
    # (domain/) elsewhere
    step_kernels = providers.Selector(
        config.derived.kernel_backend,
        torch=providers.Object(REFERENCE_KERNELS),
        triton=providers.Singleton(
            StepKernels,
            coins=triton_coins.uniform_coins,
            top_k=triton_draft_topk.top_k_probs,
            build_tree=triton_tree_build.build_tree,
            beam_step=triton_beam_step.beam_step,
            compaction_plan=triton_compaction.compaction_plan,
            verify_greedy=triton_tree_verify.verify_tree_greedy,
        ),
    )

    req_to_token_pool = providers.Singleton(
        TensorReqToTokenPool,
        max_requests=config.derived.req_to_token_rows,
        row_width=config.derived.req_to_token_row_width,
        device=device,
    )

    kv_pool = providers.Selector(
        config.target.attention_kind,
        mha=providers.Singleton(
            MHAKVPool,
            size=config.memory.max_total_tokens,
            layer_num=config.target.num_layers,
            kv_heads=config.target.num_kv_heads,
            head_dim=config.target.head_dim,
            v_head_dim=config.target.v_head_dim,
            dtype=dtype,
            device=device,
            mover=kv_mover,
            page_size=config.memory.page_size,
            debug_checks=False,
        ),
        mla=providers.Singleton(
            MLAKVPool,
            size=config.memory.max_total_tokens,
            layer_num=config.target.num_layers,
            kv_lora_rank=config.target.kv_lora_rank,
            qk_rope_head_dim=config.target.qk_rope_head_dim,
            dtype=dtype,
            device=device,
            mover=kv_mover,
            page_size=config.memory.page_size,
            debug_checks=False,
        ),
        dsa=providers.Singleton(
            DSAKVPool,
            size=config.memory.max_total_tokens,
            layer_num=config.target.num_layers,
            kv_lora_rank=config.target.kv_lora_rank,
            qk_rope_head_dim=config.target.qk_rope_head_dim,
            dtype=dtype,
            device=device,
            mover=kv_mover,
            page_size=config.memory.page_size,
            debug_checks=False,
        ),
    )

    attention_backend = providers.Selector(
        config.backend.attention,
        torch=providers.Singleton(
            TorchAttentionBackend,
            kv_pool=kv_pool,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=config.speculative.resolved.max_running_requests,
        ),
        triton=providers.Singleton(
            TritonAttentionBackend,
            kv_pool=kv_pool,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=config.speculative.resolved.max_running_requests,
        ),
        flash=providers.Singleton(
            factories.flash_attention_backend,
            kv_pool=kv_pool,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=config.speculative.resolved.max_running_requests,
        ),
    )


def tokens_allocated_per_step(resolved: ResolvedSpeculative, page_size: int) -> int:
    """KV slots one decode step claims per request (upstream's ``alloc_len_per_decode``).

    A tree takes max(S·k, N) slots (the draft writes k per step, verify N); without
    speculation one. A paged tree (v1 fallback) pads each branch's S slots to whole pages.
    """
    if not resolved.enabled:
        return 1
    steps, topk, tokens = resolved.num_steps, resolved.topk, resolved.num_draft_tokens
    if page_size > 1 and topk > 1:
        pages_per_branch = math.ceil((page_size - 1 + steps) / page_size)
        return max(pages_per_branch * page_size * topk, tokens)
    return max(steps * topk, tokens)


def req_to_token_row_width(
    max_context_len: int, resolved: ResolvedSpeculative, page_size: int
) -> int:
    """Columns of req_to_token: the context, two steps' windows (the current one and the next
    one the scheduler reserves ahead of the committed length) and a little headroom."""
    return max_context_len + 2 * tokens_allocated_per_step(resolved, page_size) + ROW_HEADROOM


def _kernel_backend(device: str) -> str:
    """Which implementation of the fused step functions runs on ``device``."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


def container_values(
    settings: EngineSettings, target: TargetDescription, resolved: ResolvedSpeculative
) -> dict[str, Any]:
    """What the strict Configuration holds: settings, resolved values, target, derived sizes."""
    values = settings.model_dump()
    values["speculative"]["resolved"] = dataclasses.asdict(resolved)
    values["target"] = dataclasses.asdict(target)
    max_context_len = settings.model.max_context_len or target.max_position_embeddings
    values["derived"] = {
        "kernel_backend": _kernel_backend(settings.model.device),
        # one row more than requests run at once: the padding row of CUDA-graph batches
        "req_to_token_rows": resolved.max_running_requests + 1,
        "max_context_len": max_context_len,
        "req_to_token_row_width": req_to_token_row_width(
            max_context_len, resolved, settings.memory.page_size
        ),
    }
    return values


def build_container(
    settings: EngineSettings | None = None, target: TargetDescription | None = None
) -> Container:
    """Resolve the settings (from the environment when None) for the target and the machine
    ("auto" device, dtype and backends, see ``resolve_platform``) and wire them.

    Raises ConfigurationError when the settings contradict each other or the target.
    """
    settings = resolve_platform(settings if settings is not None else EngineSettings())
    target = target if target is not None else TargetDescription()
    resolved = resolve_speculative(settings, target)
    container = Container(target=providers.Object(target), speculative=providers.Object(resolved))
    container.config.from_dict(container_values(settings, target, resolved))
    return container
