"""What each rank of a spawned data-parallel group runs: every case's ``DataParallelEngine``,
built from the same settings on every rank, then the group's outputs and this rank's own counts
written to ``out_dir/rank{rank}.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from eagletree.app.composition.container import build_data_parallel_engine
from eagletree.config.settings import EngineSettings


def run_cases(
    rank: int,
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    prompts: list[list[int]],
    bad_prompt: list[int],
    out: str,
) -> None:
    """``cases``: name -> (settings keywords, ``generate`` keywords). Each case's engine first
    refuses ``bad_prompt`` beside the good ones (the message is recorded), then generates."""
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name, (options, sampling) in cases.items():
        with build_data_parallel_engine(EngineSettings(**options)) as engine:
            try:
                engine.generate([*prompts, bad_prompt], **sampling)
                refused = None
            except ValueError as error:
                refused = str(error)
            outputs = engine.generate(prompts, **sampling)
            local = engine.engine.stats
            results[name] = {
                "refused": refused,
                "outputs": [r.output_ids for r in outputs],
                "num_steps": local.num_steps,
                "num_idle_steps": local.num_idle_steps,
                "prefill_tokens": local.num_prefill_tokens,
                "group_steps": engine.stats.num_steps,
                "group_generated_tokens": engine.stats.num_generated_tokens,
            }
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def fail_mid_generation_on_rank_one(
    rank: int, options: dict[str, Any], prompts: list[list[int]]
) -> None:
    """Rank 1's engine raises at its third step; rank 0 then waits for it at the next
    lockstep exchange (a hang without the group's end)."""
    torch.set_num_threads(1)
    engine = build_data_parallel_engine(EngineSettings(**options))
    if rank == 1:
        step, calls = engine.engine.step, [0]

        def breaking_step(*, run_idle: bool = False) -> Any:
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("data-parallel rank 1 broke on purpose")
            return step(run_idle=run_idle)

        engine.engine.step = breaking_step  # type: ignore[method-assign]
    engine.generate(prompts, max_new_tokens=12)


def die_mid_generation_on_rank_one(
    rank: int, options: dict[str, Any], prompts: list[list[int]]
) -> None:
    """Rank 1's process ends at its third step without a Python error (as a killed process
    does); rank 0 then waits for it at the next lockstep exchange."""
    torch.set_num_threads(1)
    engine = build_data_parallel_engine(EngineSettings(**options))
    if rank == 1:
        step, calls = engine.engine.step, [0]

        def dying_step(*, run_idle: bool = False) -> Any:
            calls[0] += 1
            if calls[0] == 3:
                os._exit(3)
            return step(run_idle=run_idle)

        engine.engine.step = dying_step  # type: ignore[method-assign]
    engine.generate(prompts, max_new_tokens=12)
