"""Application: decode throughput and time to first token while new requests keep arriving.

``eagletree bench --arrivals K``: ``bs`` background requests are prefilled and warmed up, then
the timed window begins. Before window step 0, K, 2K, ... one new request arrives (submitted,
its prompt of ``--prompt-len`` tokens, ``--new-tokens`` to generate), ``num_arrivals`` in all;
the window ends at the step after which the last arrival has finished. The background requests
get a token budget that outlasts the window, so ``bs`` of them decode throughout and every
arrival joins a running batch — where its prefill runs, beside the decode batch or alone
(``scheduler.prefill_step``), is what the mode compares. Reported: tokens of all requests
generated in the window over its seconds, each arrival's time to first token (submit to the
host's commit of its first token, the engine's clock) and the window's steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagletree.app.bench.lockstep import ALONE
from eagletree.app.bench.measure import (
    MeasurementError,
    release_requests,
    running_problem,
    step_until,
)
from eagletree.app.bench.profiling import synchronize
from eagletree.app.engine.loop import Engine
from eagletree.domain.request import Request, RequestStatus
from eagletree.domain.sampling import SamplingParams


def window_steps_bound(new_tokens: int, every: int, num_arrivals: int) -> int:
    """Most steps an arrivals window can take: the last arrival comes ``(A - 1)·K`` steps in,
    prefills in one step, decodes the rest in at most ``new_tokens - 1`` (each emits at least
    one token), waits at most one step per other arrival's lone prefill, and is read one step
    late with overlap."""
    return (num_arrivals - 1) * every + new_tokens + num_arrivals + 1


def background_budget(
    new_tokens: int, every: int, num_arrivals: int, warmup_steps: int, max_tokens_per_step: int
) -> int:
    """``max_new_tokens`` of each background request: enough that none finishes in the window."""
    steps = warmup_steps + window_steps_bound(new_tokens, every, num_arrivals) + 2
    return steps * max_tokens_per_step


@dataclass(frozen=True, slots=True)
class ArrivalsMeasurement:
    """The timed window of one arrivals run."""

    batch_size: int  # background requests
    arrival_every: int  # K: steps between two arrivals
    num_arrivals: int
    num_steps: int
    num_tokens: int  # generated in the window, background and arrivals together
    num_arrival_tokens: int  # the arrivals' share of them
    num_prefill_only_steps: int  # steps that ran prefills and no decode batch
    seconds: float
    time_to_first_token_s: tuple[float, ...]  # per arrival, in arrival order

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_time_to_first_token_s(self) -> float:
        ttft = self.time_to_first_token_s
        return sum(ttft) / len(ttft) if ttft else 0.0


def measure_arrivals(
    engine: Engine,
    background: Sequence[Sequence[int]],
    arrival_prompts: Sequence[Sequence[int]],
    *,
    every: int,
    new_tokens: int,
    max_tokens_per_step: int,
    warmup_steps: int,
    cuda: bool,
    on_arrivals: Callable[[int], None] = lambda done: None,
) -> ArrivalsMeasurement:
    """Decode ``background`` throughout while one request of ``arrival_prompts`` arrives every
    ``every`` steps; ``on_arrivals`` gets the number of finished arrivals after every step."""
    if every < 1 or not arrival_prompts:
        raise ValueError(f"every={every} must be >= 1 and there must be arrivals")
    budget = background_budget(
        new_tokens, every, len(arrival_prompts), warmup_steps, max_tokens_per_step
    )
    requests = [engine.submit(p, SamplingParams(max_new_tokens=budget)) for p in background]
    arrivals: list[Request] = []
    try:
        return _measure(
            engine, requests, arrivals, arrival_prompts, every, new_tokens, warmup_steps, cuda,
            on_arrivals,
        )  # fmt: skip
    finally:
        release_requests(engine, [*requests, *arrivals], ALONE)


def _measure(
    engine: Engine,
    background: list[Request],
    arrivals: list[Request],
    arrival_prompts: Sequence[Sequence[int]],
    every: int,
    new_tokens: int,
    warmup_steps: int,
    cuda: bool,
    on_arrivals: Callable[[int], None],
) -> ArrivalsMeasurement:
    step_until(engine, ALONE, lambda: all(r.is_prefilled for r in background), "prefill")
    retracted_before = engine.stats.num_retracted
    for _ in range(warmup_steps):
        engine.step()
    generated_before = engine.stats.num_generated_tokens
    lone_before = engine.stats.num_prefill_only_steps
    limit = window_steps_bound(new_tokens, every, len(arrival_prompts)) + 1
    num_steps = 0
    synchronize(cuda)
    started = time.perf_counter()
    while len(arrivals) < len(arrival_prompts) or any(
        r.status is not RequestStatus.FINISHED for r in arrivals
    ):
        if num_steps % every == 0 and len(arrivals) < len(arrival_prompts):
            params = SamplingParams(max_new_tokens=new_tokens)
            arrivals.append(engine.submit(arrival_prompts[len(arrivals)], params))
        if num_steps >= limit:
            raise MeasurementError(f"the arrivals did not finish in {limit} steps")
        engine.step()
        num_steps += 1
        on_arrivals(sum(r.status is RequestStatus.FINISHED for r in arrivals))
        problem = running_problem(engine, background, retracted_before, "the arrivals window")
        if problem is not None:
            raise MeasurementError(problem)
    synchronize(cuda)
    seconds = time.perf_counter() - started
    ttft = tuple(engine.result_of(r).timings.time_to_first_token_s for r in arrivals)
    return ArrivalsMeasurement(
        batch_size=len(background),
        arrival_every=every,
        num_arrivals=len(arrivals),
        num_steps=num_steps,
        num_tokens=engine.stats.num_generated_tokens - generated_before,
        num_arrival_tokens=sum(len(r.output_ids) for r in arrivals),
        num_prefill_only_steps=engine.stats.num_prefill_only_steps - lone_before,
        seconds=seconds,
        time_to_first_token_s=ttft,
    )
