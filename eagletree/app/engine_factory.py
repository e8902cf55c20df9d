"""Builds an Engine from settings: load the target checkpoint, describe it, wire the container."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.adapters.models.stack import MHALayout
from eagletree.app import factories
from eagletree.app.container import build_container
from eagletree.app.engine import Engine
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.adapters.models.loading import TargetModel
    from eagletree.config.settings import EngineSettings


def engine_from_settings(settings: EngineSettings) -> Engine:
    """The engine of ``settings.model.target_path``; ConfigurationError says what to change."""
    target_path = settings.model.target_path
    if target_path is None:
        raise ConfigurationError(
            "model.target_path is unset: set it to a checkpoint directory (config.json + "
            "safetensors), e.g. one written by `eagletree init-random`"
        )
    dtype = factories.torch_dtype(settings.model.dtype)
    model = load_target(target_path, dtype, settings.model.device)
    target = describe_target(target_path, model)
    container = build_container(settings, target)
    resolved = container.speculative()
    if resolved.enabled:
        raise ConfigurationError(
            f"speculative.algorithm = {resolved.algorithm!r}: the speculative workers are not "
            "wired into the engine yet; set speculative.algorithm = 'none'"
        )
    runner = TargetModelRunner(
        model,
        kv_pool=container.kv_pool(),
        req_to_token_pool=container.req_to_token_pool(),
        attention_backend=container.attention_backend(),
    )
    return Engine.non_speculative(
        runner,
        container.slot_allocator(),
        max_context_len=settings.model.max_context_len or target.max_position_embeddings,
        max_running_requests=resolved.max_running_requests,
        eos_token_ids=eos_token_ids(target_path),
    )


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


def eos_token_ids(path: str | Path) -> frozenset[int]:
    """End-of-sequence ids of a checkpoint: ``eos_token_id`` of config.json and of
    generation_config.json (an int, a list, or absent), united."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        file = Path(path) / name
        if not file.is_file():
            continue
        value = json.loads(file.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)
