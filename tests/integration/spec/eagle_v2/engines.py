"""The EagleWorkerV2 tests' grid of tree shapes and model pairs, their prompts, the
oracle-draft engine and random checkpoints on disk (also used by the overlap and
prefill-step tests)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch
from eagletree.ports.model import DraftRunner
from tests.integration.spec.harness import (
    SIZES,
    WEIGHT_STD,
    SpecEngine,
    SpecModels,
    greedy_outputs,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.oracle_draft import OracleDraft

CONFIGS = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (4, 8, 32), (5, 16, 64)]  # (S, k, N)
MODELS = [
    ("llama", "eagle"),
    ("llama", "eagle3"),
    ("deepseek-mla", "eagle"),
    ("deepseek-mla", "eagle3"),
]
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9]
MAX_NEW = 16

ModelCache = Callable[..., SpecModels]


def prompts_for(batch_size: int, seed: int) -> list[list[int]]:
    lengths = [PROMPT_LENGTHS[(seed + i) % len(PROMPT_LENGTHS)] for i in range(batch_size)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


def oracle_engine(
    models: SpecModels,
    config: tuple[int, int, int],
    prompts: Sequence[Sequence[int]],
    max_new: int,
    **options: object,
) -> tuple[SpecEngine, OracleDraft, list[list[int]]]:
    """A speculative engine whose draft knows the target's greedy continuation of ``prompts``;
    returns it, the oracle, and the greedy outputs (``max_new`` tokens) it must reproduce."""
    margin = config[0] + 2  # the oracle looks up to S + 1 tokens past the committed ones
    continuation = greedy_outputs(plain_engine(models), prompts, max_new + margin)
    sequences = {tuple(p): [*p, *out] for p, out in zip(prompts, continuation, strict=True)}
    engines: list[SpecEngine] = []
    oracles: list[OracleDraft] = []

    def sequence_of_row(row: int) -> list[int]:
        [owner] = [r for r in engines[0].engine.scheduler.running if r.row == row]
        return sequences[owner.prompt_ids]

    def wrap(draft: DraftRunner) -> DraftRunner:
        oracles.append(OracleDraft(draft, sequence_of_row, config[1], seed=sum(config)))  # type: ignore[arg-type]
        return oracles[0]

    engines.append(speculative_engine(models, *config, wrap_draft=wrap, **options))  # type: ignore[arg-type]
    return engines[0], oracles[0], [out[:max_new] for out in continuation]


def random_checkpoints(
    root: Path, arch: Arch, kind: DraftKind, num_mtp_layers: int = 1
) -> tuple[str, str]:
    """Random float32 checkpoints; an MTP target's config.json declares its NextN layers."""
    sizes = dataclasses.replace(SIZES, num_mtp_layers=num_mtp_layers)
    target_dir, draft_dir = write_random_checkpoint(
        root, arch, kind, sizes=sizes, dtype=torch.float32, std=WEIGHT_STD
    )
    assert draft_dir is not None
    if kind == "mtp":
        config = json.loads((target_dir / "config.json").read_text())
        config["num_nextn_predict_layers"] = num_mtp_layers
        (target_dir / "config.json").write_text(json.dumps(config))
    return str(target_dir), str(draft_dir)
