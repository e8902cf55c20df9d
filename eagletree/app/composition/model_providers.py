"""Composition root, models part: the rank's place and device, the loaded target and draft
models, and what the settings rules learn from them (the target description, the resolved
speculative parameters, the context length).

``ModelProviders`` is the first layer of ``Container`` (``app/composition/__init__.py``); the
pools part builds on it, the worker part on that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from dependency_injector import containers, providers

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.draft_loading import eagle3_aux_layer_ids, load_draft
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.stack import MHALayout
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel
from eagletree.adapters.text.hf_tokenizer import load_tokenizer
from eagletree.app.composition import factories, sizing, startup
from eagletree.app.composition.run_settings import read_token_map_setting
from eagletree.app.parallel import distributed, process_group
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription

if TYPE_CHECKING:
    from eagletree.adapters.models.draft_loading import DraftKind, DraftModel
    from eagletree.adapters.models.model_building import TargetModel
    from eagletree.config.eagle_hook import ResolvedSpeculative


def describe_target(path: str | Path, model: TargetModel) -> TargetDescription:
    """What the settings rules and the pools need to know about a loaded target."""
    known = TargetDescription.for_architecture(ConfigReader.from_dir(path).architecture())
    layout = model.kv_layout
    known = replace(
        known,
        num_layers=layout.layer_num,
        max_position_embeddings=model.config.max_position_embeddings,
        num_mtp_layers=getattr(model.config, "num_nextn_predict_layers", 0),
    )
    if isinstance(layout, MHALayout):
        return replace(
            known,
            attention_kind="mha",
            num_kv_heads=layout.kv_heads,
            head_dim=layout.head_dim,
            v_head_dim=layout.v_head_dim,
        )
    return replace(
        known,
        attention_kind="mla" if known.attention_kind == "mha" else known.attention_kind,
        kv_lora_rank=layout.kv_lora_rank,
        qk_rope_head_dim=layout.qk_rope_head_dim,
    )


def described_target(settings: EngineSettings, path: str, model: TargetModel) -> TargetDescription:
    """``describe_target``, refusing a ``model.max_context_len`` beyond the target's limit."""
    target = describe_target(path, model)
    startup.check_context_len(settings, target)
    return target


def aux_layer_ids(algorithm: str, target_path: str, draft_path: str | None) -> tuple[int, ...]:
    """The target layers an EAGLE-3 draft reads (none for other algorithms)."""
    if algorithm != "eagle3" or draft_path is None:
        return ()
    num_layers = ConfigReader.from_dir(target_path).get_int("num_hidden_layers")
    return eagle3_aux_layer_ids(draft_path, num_layers)


def load_draft_heads(
    resolved: ResolvedSpeculative, target: TargetModel, dtype: torch.dtype
) -> list[DraftModel]:
    """The draft head(s) of ``resolved.draft_path``: one for EAGLE / EAGLE-3, one per MTP layer;
    an EAGLE head restricted to ``resolved.token_map``'s tokens when one is set."""
    vocab_size = target.config.vocab_size
    startup.check_topk(resolved, vocab_size)
    assert resolved.draft_path is not None  # resolve_speculative names one when enabled
    kind: DraftKind = resolved.algorithm  # type: ignore[assignment]
    token_map = read_token_map_setting(resolved.token_map, vocab_size)
    drafts = load_draft(resolved.draft_path, kind, target, dtype, token_map=token_map)
    # the whole vocabulary was checked above: only the drafts proposing from part of it
    startup.check_draft_topk(
        resolved, [d.token_ids.numel() for d in drafts if d.token_ids is not None]
    )
    return drafts


def tensor_parallel_of(groups: distributed.ParallelGroups) -> TensorParallel:
    """This rank's place in the group its models are sharded over."""
    if groups.tp_group is None:
        return SINGLE
    return TensorParallel(groups.tp_rank, groups.tp_size, groups.tp_group)


def dense_group_of(groups: distributed.ParallelGroups) -> DenseGroup | None:
    """The data-parallel group this rank's dense layers are sharded over; None when they are
    not (``parallel.shard_dense_over_dp`` off, or one replica)."""
    if groups.dense_group is None:
        return None
    tp = TensorParallel(groups.dp_rank, groups.dp_size, groups.dense_group)
    return DenseGroup(tp, count_group=groups.dp_group)


class ModelProviders(containers.DeclarativeContainer):
    """The settings, the rank's groups and device, the models and what they tell the rules."""

    config = providers.Configuration(strict=True)
    settings = providers.Dependency(instance_of=EngineSettings)
    # receives the progress lines of long start-up work (CUDA-graph capture); None: the logger
    progress: providers.Object[Callable[[str], None] | None] = providers.Object(None)

    # the groups of this rank: the models are sharded over the tensor-parallel one, the
    # data-parallel engine steps in lockstep over the other (one rank of each by default)
    parallel_groups = providers.Singleton(
        distributed.parallel_groups,
        config.parallel.tp_size,
        config.parallel.dp_size,
        config.parallel.shard_dense_over_dp,
    )
    tensor_parallel = providers.Singleton(tensor_parallel_of, parallel_groups)
    # with parallel.shard_dense_over_dp: the MLP, embedding and lm_head over the dp group
    dense_group = providers.Singleton(dense_group_of, parallel_groups)
    device = providers.Singleton(
        process_group.rank_device,
        config.model.device,
        providers.Callable(process_group.group_rank),
        providers.Callable(process_group.world_size),
    )
    dtype = providers.Callable(factories.torch_dtype, config.model.dtype)

    # -- models and what the settings rules learn from them -----------------------------------
    target_model = providers.Singleton(
        load_target,
        config.model.target_path,
        dtype,
        device,
        providers.Callable(
            aux_layer_ids,
            config.speculative.algorithm,
            config.model.target_path,
            config.model.draft_path,
        ),
        tp=tensor_parallel,
        dense=dense_group,
    )
    target = providers.Singleton(described_target, settings, config.model.target_path, target_model)
    speculative = providers.Singleton(resolve_speculative, settings, target)
    draft_models = providers.Singleton(load_draft_heads, speculative, target_model, dtype)
    tokenizer = providers.Singleton(load_tokenizer, config.model.target_path)

    # the shapes the v2 worker drafts: the configured one, or the fastest candidate each step
    shape_policy = providers.Singleton(startup.shape_policy_decision, settings, speculative)
    worker_name = providers.Callable(str, speculative.provided.worker)
    max_running_requests = speculative.provided.max_running_requests
    max_context_len = providers.Callable(
        sizing.max_context_len,
        config.model.max_context_len,
        target.provided.max_position_embeddings,
    )
