"""The overlap tests' grid, prompts, and what a run must keep whether or not a step
is in flight."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eagletree.app.engine.loop import Engine
from eagletree.app.engine.reports import GenerationResult
from tests.integration.spec.harness import SIZES, SpecModels, ragged_prompts

ModelCache = Callable[..., SpecModels]
MODELS = [
    ("llama", "eagle"),
    ("llama", "eagle3"),
    ("deepseek-mla", "eagle"),
    ("deepseek-mla", "eagle3"),
]
CONFIGS = [(3, 1, 4), (5, 4, 8)]  # (S, k, N): a chain and a tree
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9]
MAX_NEW = 16


def prompts_for(batch_size: int, seed: int) -> list[list[int]]:
    lengths = [PROMPT_LENGTHS[(seed + i) % len(PROMPT_LENGTHS)] for i in range(batch_size)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


def summary(results: Sequence[GenerationResult], acceptance: bool = True) -> list[tuple[Any, ...]]:
    """What must not depend on overlap: tokens, finish reasons, per-step acceptance (unless
    the draft draws from a generator of its own, whose draws depend on the batches)."""
    return [
        (
            r.output_ids,
            r.finish_reason,
            r.acceptance.histogram if r.acceptance and acceptance else None,
        )
        for r in results
    ]


def assert_ran_ahead(engine: Engine) -> None:
    """The overlapped engine really launched steps before reading their predecessors."""
    assert engine.overlap and engine.stats.num_steps_ahead > engine.stats.num_steps // 2
