"""Server metrics: written by the engine loop thread, rendered as Prometheus text.

The loop thread updates the values, the HTTP thread renders them; a lock keeps a rendering
from seeing a half-recorded step. Names start with ``eagletree_``; ``_total`` marks counters.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eagletree.app.workers.speculative_worker import SpeculativeWorker

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine
    from eagletree.app.engine.streaming import StreamEvent

# Prometheus needs a histogram's buckets fixed for the life of the series: one per token count
# a verify step can emit with trees up to 15 deep; longer steps count in +Inf alone.
ACCEPTANCE_BUCKETS = tuple(range(1, 17))
DEPTHS = tuple(range(1, 16))  # the draft depths whose acceptance the histogram can tell


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """An engine's state as /metrics shows it: one engine's, or a data-parallel group's
    (``summed`` over its replicas)."""

    num_running: int
    num_waiting: int
    kv_slots_total: int
    kv_slots_free: int
    rows_total: int
    rows_free: int
    num_generated_tokens: int
    busy_s: float  # inside ``Engine.step``
    # decode steps of each draft shape (speculative workers; an adaptive one chooses per step)
    shape_steps: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def of(engine: Engine) -> EngineGauges:
        scheduler = engine.scheduler
        allocator, pool = scheduler.allocator, scheduler.req_to_token_pool
        # rows are counted as the scheduler admits: a request needs a free row and a place
        # under max_running_requests (the pool also holds the padding row of CUDA-graph
        # batches, which no request ever gets, taken or not)
        rows_total = scheduler.max_running_requests
        return EngineGauges(
            len(scheduler.running),
            len(scheduler.waiting),
            allocator.size,
            allocator.available_size(),
            rows_total,
            min(pool.available_size(), rows_total - len(scheduler.running)),
            engine.stats.num_generated_tokens,
            engine.stats.busy_s,
            _shape_steps(engine),
        )

    @staticmethod
    def summed(parts: Sequence[EngineGauges]) -> EngineGauges:
        """The replicas' counts added up; busy time once (they step in lockstep: the most)."""
        fields = [
            f.name
            for f in dataclasses.fields(EngineGauges)
            if f.name not in ("busy_s", "shape_steps")
        ]
        totals = {name: sum(getattr(part, name) for part in parts) for name in fields}
        return EngineGauges(
            **totals,
            busy_s=max((part.busy_s for part in parts), default=0.0),
            shape_steps=sum((part.shape_steps for part in parts), Counter()),
        )


def _shape_steps(engine: Engine) -> Counter[str]:
    """The decode steps of each draft shape an engine's speculative worker ran."""
    worker = engine.worker
    if not isinstance(worker, SpeculativeWorker):
        return Counter()
    return Counter({shape.label: n for shape, n in worker.shape_steps.items()})


@dataclass(slots=True)
class ServerMetrics:
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_client_aborts: int = 0
    num_steps: int = 0
    num_batched_steps: int = 0  # steps that advanced two or more requests at once
    max_step_batch: int = 0
    step_seconds: float = 0.0
    finished: Counter[str] = field(default_factory=Counter)
    # acceptance[i] = verify steps that emitted i tokens, over finished requests
    acceptance: Counter[int] = field(default_factory=Counter)
    # data-parallel: requests placed on each replica (empty for one engine)
    requests_by_replica: Counter[int] = field(default_factory=Counter)
    num_running: int = 0
    num_waiting: int = 0
    num_active: int = 0
    kv_slots_total: int = 0
    kv_slots_free: int = 0
    rows_total: int = 0
    rows_free: int = 0
    tokens_per_s: float = 0.0
    shape_steps: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_step(self, batch: int, seconds: float) -> None:
        with self.lock:
            self._record_step(batch, seconds)

    def _record_step(self, batch: int, seconds: float) -> None:
        self.num_steps += 1
        self.step_seconds += seconds
        self.num_batched_steps += batch >= 2
        self.max_step_batch = max(self.max_step_batch, batch)

    def record_finished(self, event: StreamEvent) -> None:
        with self.lock:
            self._record_finished(event)

    def _record_finished(self, event: StreamEvent) -> None:
        assert event.finish_reason is not None
        self.finished[event.finish_reason.value] += 1
        if event.result is not None and event.result.acceptance is not None:
            for tokens, steps in enumerate(event.result.acceptance.histogram):
                self.acceptance[tokens] += steps

    def update_memory(self, engine: Engine) -> None:
        self.update_gauges(EngineGauges.of(engine))

    def update_gauges(self, gauges: EngineGauges) -> None:
        with self.lock:
            self.num_running = gauges.num_running
            self.num_waiting = gauges.num_waiting
            self.kv_slots_total = gauges.kv_slots_total
            self.kv_slots_free = gauges.kv_slots_free
            self.rows_total = gauges.rows_total
            self.rows_free = gauges.rows_free
            self.num_generated_tokens = gauges.num_generated_tokens
            self.shape_steps = gauges.shape_steps
            busy_s = gauges.busy_s
            self.tokens_per_s = gauges.num_generated_tokens / busy_s if busy_s > 0 else 0.0

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        with self.lock:
            return self._render()

    def _render(self) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP eagletree_{name} {help_text}")
            lines.append(f"# TYPE eagletree_{name} {kind}")
            for labels, value in samples:
                lines.append(f"eagletree_{name}{labels} {value}")

        metric("requests_total", "counter", "Requests accepted.", [("", self.num_requests)])
        metric(
            "requests_finished_total",
            "counter",
            "Requests finished, by reason.",
            [(f'{{reason="{reason}"}}', n) for reason, n in sorted(self.finished.items())],
        )
        if self.requests_by_replica:
            metric(
                "replica_requests_total",
                "counter",
                "Requests placed on each data-parallel replica.",
                [(f'{{replica="{r}"}}', n) for r, n in sorted(self.requests_by_replica.items())],
            )
        metric(
            "client_aborts_total",
            "counter",
            "Requests aborted because their client went away.",
            [("", self.num_client_aborts)],
        )
        metric("prompt_tokens_total", "counter", "Prompt tokens.", [("", self.num_prompt_tokens)])
        metric(
            "generation_tokens_total",
            "counter",
            "Generated tokens.",
            [("", self.num_generated_tokens)],
        )
        metric(
            "generation_tokens_per_second",
            "gauge",
            "Generated tokens per second of engine step time.",
            [("", round(self.tokens_per_s, 3))],
        )
        metric("engine_steps_total", "counter", "Engine steps.", [("", self.num_steps)])
        metric(
            "engine_batched_steps_total",
            "counter",
            "Engine steps that advanced two or more requests.",
            [("", self.num_batched_steps)],
        )
        metric(
            "engine_step_max_batch",
            "gauge",
            "Most requests advanced by one step.",
            [("", self.max_step_batch)],
        )
        metric("requests_running", "gauge", "Requests running.", [("", self.num_running)])
        metric("requests_waiting", "gauge", "Requests queued.", [("", self.num_waiting)])
        metric("kv_slots_total", "gauge", "KV slots of the pool.", [("", self.kv_slots_total)])
        metric(
            "kv_slots_used",
            "gauge",
            "KV slots held by requests.",
            [("", self.kv_slots_total - self.kv_slots_free)],
        )
        metric("kv_slots_free", "gauge", "KV slots free.", [("", self.kv_slots_free)])
        metric("request_rows_free", "gauge", "Free req_to_token rows.", [("", self.rows_free)])
        buckets: list[tuple[str, float]] = [
            (f'_bucket{{le="{bound}"}}', sum(n for t, n in self.acceptance.items() if t <= bound))
            for bound in ACCEPTANCE_BUCKETS
        ]
        total_steps = sum(self.acceptance.values())
        total_tokens = sum(tokens * n for tokens, n in self.acceptance.items())
        buckets.append(('_bucket{le="+Inf"}', total_steps))
        buckets += [("_sum", total_tokens), ("_count", total_steps)]
        metric(
            "acceptance_length",
            "histogram",
            "Tokens emitted per speculative verify step (finished requests).",
            buckets,
        )
        metric(
            "acceptance_at_depth",
            "gauge",
            "P(a verify step accepts its d-th draft | it accepted d - 1), from the histogram.",
            [
                (f'{{depth="{d}"}}', _accepted_at(self.acceptance, d))
                for d in ACCEPTANCE_BUCKETS[:-1]
            ],
        )
        metric(
            "draft_shape_steps_total",
            "counter",
            "Decode steps of each draft shape.",
            [(f'{{shape="{s}"}}', n) for s, n in sorted(self.shape_steps.items())],
        )
        return "\n".join(lines) + "\n"


def _accepted_at(histogram: Counter[int], depth: int) -> float:
    """Of the verify steps that emitted at least ``depth`` tokens (accepted depth − 1 drafts),
    the share that emitted more; NaN before any did."""
    reached = sum(n for tokens, n in histogram.items() if tokens >= depth)
    beyond = sum(n for tokens, n in histogram.items() if tokens > depth)
    return beyond / reached if reached else float("nan")
