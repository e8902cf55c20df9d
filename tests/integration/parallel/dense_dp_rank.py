"""What each rank of a spawned data-parallel group with its dense layers sharded over the group
runs: every case's engine, built through the container from the same settings, generates the
prompts; the outputs, this rank's dense parameter count, its idle steps and every step's own
and agreed phases are written to ``out_dir/rank{rank}.json``. A refused case records its error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from eagletree.adapters.models.layers import PreNormDecoderLayer
from eagletree.adapters.models.model_building import TargetModel
from eagletree.app.composition.container import build_engine_container
from eagletree.app.engine.plan import SchedulePlan, StepPhases
from eagletree.app.parallel.data_parallel import DataParallelEngine
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError


def dense_parameter_count(model: TargetModel) -> int:
    """Elements of the target's embedding, lm_head (once when tied) and decoder-layer MLPs."""
    layers = cast("list[PreNormDecoderLayer]", list(model.layers))
    modules: list[nn.Module] = [model.embed_tokens, model.lm_head]
    modules += [layer.mlp for layer in layers]
    unique = {id(p): p for m in modules for p in m.parameters()}
    return sum(p.numel() for p in unique.values())


def run_dense_cases(
    rank: int,
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    prompts: list[list[int]],
    out: str,
) -> None:
    """``cases``: name -> (settings keywords, ``generate`` keywords)."""
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name, (options, sampling) in cases.items():
        container = build_engine_container(EngineSettings(**options))
        groups = container.parallel_groups()
        try:
            engine = DataParallelEngine(container.engine(), groups)
        except ConfigurationError as error:
            results[name] = {"refused": str(error)}
            continue
        phases: list[tuple[StepPhases, StepPhases]] = []
        agreement = container.phase_agreement()
        assert agreement is not None, "the dense layers are not shared: no phase agreement"
        agree = agreement.agree

        def logged(plan: SchedulePlan, agree: Any = agree, log: list[Any] = phases) -> StepPhases:
            agreed: StepPhases = agree(plan)
            log.append((StepPhases(bool(plan.prefill), bool(plan.decode)), agreed))
            return agreed

        agreement.agree = logged  # type: ignore[method-assign]
        with engine:
            outputs = engine.generate(prompts, **sampling)
        results[name] = {
            "outputs": [r.output_ids for r in outputs],
            "dense_parameters": dense_parameter_count(container.target_model()),
            "num_steps": engine.engine.stats.num_steps,
            "num_idle_steps": engine.engine.stats.num_idle_steps,
            "phases": phases,
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
