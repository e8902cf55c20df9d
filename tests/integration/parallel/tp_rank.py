"""What each rank of a spawned tensor-parallel group runs: every case's engine, built through
``Engine``'s container from the same settings on every rank, then its greedy outputs and the
shapes of its shards written to ``out_dir/rank{rank}.json``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from eagletree.adapters.models.eagle import EagleDraft
from eagletree.app.composition.container import build_engine_container
from eagletree.config.settings import EngineSettings


def run_cases(
    rank: int,
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    prompts: list[list[int]],
    out: str,
) -> None:
    """``cases``: name -> (settings keywords, ``Engine.generate`` keywords)."""
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name, (options, sampling) in cases.items():
        container = build_engine_container(EngineSettings(**options))
        engine = container.engine()
        target = container.target_model()
        outputs = [r.output_ids for r in engine.generate(prompts, **sampling)]
        results[name] = {
            "outputs": outputs,
            "embed_rows": target.embed_tokens.weight.shape[0],
            "kv_layout": list(target.kv_layout),
            "draft_kv_layouts": [list(d.kv_layout) for d in container.draft_models()]
            if "draft_path" in options["model"]
            else [],
        }
        token_map = options.get("speculative", {}).get("token_map")
        if token_map is not None:  # an EAGLE head restricted to the map's rows
            head = container.draft_models()[0]
            assert isinstance(head, EagleDraft) and head.mapped_lm_head is not None
            results[name]["mapped_lm_head"] = head.mapped_lm_head.weight.tolist()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def fail_on_rank_one(rank: int) -> None:
    """Rank 1 raises; rank 0 waits for it in a collective (a hang without the group's end)."""
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    torch.distributed.barrier()


def hang_on_rank_one(rank: int) -> None:
    if rank == 1:
        time.sleep(120)
