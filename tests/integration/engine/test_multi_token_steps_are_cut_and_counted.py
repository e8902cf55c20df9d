"""Speculative-shaped steps through the engine loop: a stand-in worker emitting
several tokens a step is cut at EOS and max_new_tokens and counted as acceptance."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from eagletree.app.engine.loop import Engine
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.worker import StepOutput
from eagletree.domain.request import Request
from tests.fakes import FakeRunner, fake_engine_parts
from tests.integration.engine.fake_engines import PROMPTS, fake_engine


class OracleChainWorker:
    """A stand-in for a speculative worker: each decode step emits 1..max_emit greedy tokens
    of the fake model (known on the host), committing as many, inside a 2·max_emit window."""

    def __init__(self, runner: FakeRunner, max_emit: int, seed: int) -> None:
        self._runner = runner
        self._max_emit = max_emit
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def reserve_per_step(self) -> int:
        return 2 * self._max_emit

    @property
    def grow_ahead(self) -> int:
        return 3 * self._max_emit  # windows grow one step in several

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        return False  # it reads the requests' tokens on the host

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        return 0.0  # it has no device step to capture

    def calibrate(self, progress: Callable[[str], None] | None = None) -> None:
        return None  # it chooses nothing per step

    def untimed_steps(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # it times nothing

    def step(self, plan: SchedulePlan) -> StepOutput:
        rows, emitted, committed = [], [], []
        for request in plan.prefill + plan.decode:
            count = 1
            if request in plan.decode:
                count = int(torch.randint(1, self._max_emit + 1, (1,), generator=self._generator))
                assert request.allocated_len >= request.committed_len + self.reserve_per_step
            tokens = self._runner.greedy_reference(request.all_ids, count)
            rows.append(tokens + [0] * (self._max_emit - count))
            emitted.append(count)
            committed.append(request.num_tokens - request.committed_len + count - 1)
        return StepOutput(
            requests=plan.prefill + plan.decode,
            tokens=torch.tensor(rows),
            num_emitted=torch.tensor(emitted),
            num_committed=torch.tensor(committed),
            num_forwards=1,
            num_prefill=len(plan.prefill),
            speculative=True,
        )


def test_multi_token_steps_are_cut_at_eos_and_max_new_tokens_and_counted_as_acceptance() -> None:
    probe, _ = fake_engine()
    expected = probe.generate(PROMPTS, max_new_tokens=11)
    eos = expected[0].output_ids[6]
    runner_for_chain, allocator = fake_engine_parts(pool_size=256, row_width=64)
    engine = Engine(
        OracleChainWorker(runner_for_chain, max_emit=4, seed=1),
        allocator,
        runner_for_chain.req_to_token_pool,
        vocab_size=32,
        max_context_len=48,
        max_running_requests=4,
        eos_token_ids=(eos,),
    )
    results = engine.generate(PROMPTS, max_new_tokens=11)
    for result, reference in zip(results, expected, strict=True):
        ids = reference.output_ids
        cut = ids.index(eos) + 1 if eos in ids else len(ids)
        assert result.output_ids == ids[:cut]
        if len(result.output_ids) == 1:  # finished by its prefill: no verify step
            assert result.acceptance is None
            continue
        acceptance = result.acceptance
        assert acceptance is not None
        assert all(1 <= n <= 4 for n, steps in enumerate(acceptance.histogram) if steps)
        # every step's tokens were emitted; only the last step may overshoot the cut
        overshoot = acceptance.num_emitted - (len(result.output_ids) - 1)
        assert 0 <= overshoot < 4
    assert engine.stats.acceptance is not None and engine.stats.acceptance.mean_accept_length > 1
    assert allocator.available_size() == 256
