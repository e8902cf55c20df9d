"""App: what an engine reports — each request's result and timings, the engine's counters,
and the progress a display gets after every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from eagletree.domain.acceptance_stats import AcceptanceStats
from eagletree.domain.request import FinishReason, Request


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """Seconds from a request's arrival: queueing, first token, total; decode throughput."""

    queue_s: float
    time_to_first_token_s: float
    latency_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What one request produced; ``acceptance`` is None without speculation."""

    request_id: int
    prompt_ids: tuple[int, ...]
    output_ids: list[int]
    finish_reason: FinishReason
    timings: RequestTimings
    num_retractions: int = 0
    acceptance: AcceptanceStats | None = None
    text: str | None = None  # the decoded output when the engine has a tokenizer

    @staticmethod
    def of(request: Request) -> GenerationResult:
        times = request.times
        assert request.finish_reason is not None and times.finished is not None, request
        admitted = times.first_admitted if times.first_admitted is not None else times.finished
        first = times.first_token if times.first_token is not None else times.finished
        decode_s = times.finished - first
        num_decoded = max(len(request.output_ids) - 1, 0)
        return GenerationResult(
            request_id=request.request_id,
            prompt_ids=request.prompt_ids,
            output_ids=list(request.output_ids),
            finish_reason=request.finish_reason,
            timings=RequestTimings(
                queue_s=admitted - times.arrival,
                time_to_first_token_s=first - times.arrival,
                latency_s=times.finished - times.arrival,
                decode_tokens_per_s=num_decoded / decode_s if decode_s > 0 else 0.0,
            ),
            num_retractions=request.num_retractions,
            acceptance=(
                AcceptanceStats.from_counts(request.emitted_per_step)
                if request.emitted_per_step
                else None
            ),
        )


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine was built; ``busy_s`` is the time spent inside ``step``."""

    num_steps: int = 0
    num_steps_ahead: int = 0  # launched while the previous step was in flight (overlap)
    num_idle_steps: int = 0  # worker steps over no request (bs == 0), a data-parallel rank's
    num_prefill_only_steps: int = 0  # steps of prefills and no decode batch (a lone prefill)
    num_forwards: int = 0
    num_prefill_tokens: int = 0  # prompt tokens computed, recomputation after retract included
    num_generated_tokens: int = 0
    num_retracted: int = 0
    num_aborted: int = 0
    num_finished: int = 0
    busy_s: float = 0.0
    emitted_per_step: list[int] = field(default_factory=list)

    @property
    def generated_tokens_per_s(self) -> float:
        return self.num_generated_tokens / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def acceptance(self) -> AcceptanceStats | None:
        return AcceptanceStats.from_counts(self.emitted_per_step) if self.emitted_per_step else None


@dataclass(frozen=True, slots=True)
class StepReport:
    """Progress after one step, for displays: ``generate(..., on_step=...)``."""

    step: int
    num_running: int
    num_waiting: int
    num_generated_tokens: int
    num_finished: int
    elapsed_s: float
