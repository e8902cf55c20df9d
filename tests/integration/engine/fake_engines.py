"""Engines over the fake runner (``tests/fakes.py``) for the engine tests, and their
prompts."""

from __future__ import annotations

import torch

from eagletree.app.engine.loop import Engine
from eagletree.domain.sampling import SamplingParams
from tests.fakes import FakeRunner, fake_engine_parts, plain_engine

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], [12]]


def fake_engine(
    pool_size: int = 512,
    max_running: int = 8,
    context: int = 48,
    eos_token_ids: tuple[int, ...] = (),
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[Engine, FakeRunner]:
    runner, allocator = fake_engine_parts(
        pool_size=pool_size, row_width=context + 4, seed=seed, device=device
    )
    engine = plain_engine(
        runner,
        allocator,
        max_context_len=context,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
    )
    return engine, runner


def slots_in_use(engine: Engine) -> int:
    allocator = engine.scheduler.allocator
    return allocator.size - allocator.available_size()


def _params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens)
