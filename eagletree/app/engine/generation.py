"""App: generation for a list of prompts at once over an engine's submit/step loop.

What ``Engine.generate`` and ``Engine.stream`` run: encode and check every prompt before any
is queued, submit them with their sampling parameters, then step the engine until each has
finished — reporting progress after every step, or yielding each request's new output. Only
the engine's public surface is used (``SteppedEngine``), so the engine itself stays the step
loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from eagletree.app.engine.reports import EngineStats, GenerationResult, StepReport
from eagletree.app.engine.streaming import OutputWatcher, StreamEvent
from eagletree.domain.request import Request, RequestStatus
from eagletree.domain.sampling import SamplingParams

if TYPE_CHECKING:
    from eagletree.app.engine.prompts import Prompt
    from eagletree.app.engine.scheduler import Scheduler
    from eagletree.ports.tokenizer import Tokenizer


class SteppedEngine(Protocol):
    """What generation asks of an engine (``Engine`` is one): queue, abort, step, report."""

    tokenizer: Tokenizer | None
    stats: EngineStats

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def scheduler(self) -> Scheduler: ...

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request: ...

    def abort(self, request_id: int) -> bool: ...

    def step(self, *, run_idle: bool = False) -> list[Request]: ...

    def encode(self, prompt: Prompt, index: int = 0) -> list[int]: ...

    def check_prompt(self, index: int, prompt: Sequence[int], max_new_tokens: int) -> None: ...

    def result_of(self, request: Request) -> GenerationResult: ...


@dataclass(frozen=True, slots=True)
class PromptBatch:
    """The prompts of one ``generate`` / ``stream`` call and the sampling they share."""

    prompts: Sequence[Prompt]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: Collection[int] | None = None

    def sampling(self, index: int) -> SamplingParams:
        """Prompt ``index``'s parameters: with ``seed``, its own seed ``seed + index``, so its
        output does not depend on the other prompts of the call."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=None if self.seed is None else self.seed + index,
            stop_token_ids=frozenset(self.stop_token_ids or ()),
        )


def generate(
    engine: SteppedEngine,
    batch: PromptBatch,
    on_step: Callable[[StepReport], None] | None,
) -> list[GenerationResult]:
    """``Engine.generate``: step until every prompt's request finished; results in prompt order."""
    requests = submit_prompts(engine, batch)
    started = engine.clock()
    generated_before = engine.stats.num_generated_tokens
    while any(r.status is not RequestStatus.FINISHED for r in requests):
        engine.step()
        if on_step is not None:
            on_step(
                StepReport(
                    step=engine.stats.num_steps,
                    num_running=len(engine.scheduler.running),
                    num_waiting=len(engine.scheduler.waiting),
                    num_generated_tokens=engine.stats.num_generated_tokens - generated_before,
                    num_finished=sum(r.status is RequestStatus.FINISHED for r in requests),
                    elapsed_s=engine.clock() - started,
                )
            )
    return [engine.result_of(r) for r in requests]


def stream(
    engine: SteppedEngine,
    batch: PromptBatch,
) -> Generator[StreamEvent, None, None]:
    """``Engine.stream``: each request's new output as steps commit it; nothing is queued
    before the first ``next``, and closing early aborts and releases what is unfinished."""
    requests = submit_prompts(engine, batch)
    watchers = [OutputWatcher(i, r, engine.tokenizer) for i, r in enumerate(requests)]
    try:
        while not all(w.done for w in watchers):
            engine.step()
            for watcher in watchers:
                event = watcher.poll()
                if event is None:
                    continue
                if event.finished:
                    event = dataclasses.replace(event, result=engine.result_of(watcher.request))
                yield event
    finally:
        abort_and_release(engine, requests)


def submit_prompts(
    engine: SteppedEngine,
    batch: PromptBatch,
) -> list[Request]:
    """Queue one request per prompt (``checked_requests``)."""
    return [engine.submit(ids, params) for ids, params in checked_requests(engine, batch)]


def checked_requests(
    engine: SteppedEngine,
    batch: PromptBatch,
) -> list[tuple[list[int], SamplingParams]]:
    """Each prompt's token ids and sampling parameters, request i seeded with ``seed + i``;
    every prompt is encoded and checked first, so a ValueError naming the first bad one comes
    before anything is queued."""
    if batch.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {batch.max_new_tokens}")
    if isinstance(batch.prompts, str):
        raise ValueError("prompts is one text: pass a list of prompts, e.g. [text]")
    ids = [engine.encode(prompt, index) for index, prompt in enumerate(batch.prompts)]
    for index, prompt in enumerate(ids):
        engine.check_prompt(index, prompt, batch.max_new_tokens)
    return [(prompt, batch.sampling(index)) for index, prompt in enumerate(ids)]


def abort_and_release(engine: SteppedEngine, requests: Sequence[Request]) -> None:
    """Abort the unfinished ones of ``requests`` and step until their rows and slots are free."""
    unfinished = [r for r in requests if r.status is not RequestStatus.FINISHED]
    for request in unfinished:
        engine.abort(request.request_id)
    while any(r.status is not RequestStatus.FINISHED for r in unfinished):
        engine.step()  # the next schedule releases the aborted requests' rows and slots
