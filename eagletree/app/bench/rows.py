"""Application: the rows of `eagletree bench`, one per measured (configuration, batch size,
temperature), and what is derived from a row's own numbers.

``break_even`` is a speculative row's step time divided by the plain row's at the same batch
size and temperature: the mean acceptance length at which speculation starts to pay. With
``--arrivals`` a row is one (configuration, batch size, prefill step) of the arrivals mode
(``ArrivalRow``). Their markdown and JSON forms are ``report``'s.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagletree.app.bench.device_gaps import DeviceGaps


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One measured (configuration, batch size); None where a value was not measured."""

    config: str
    batch_size: int
    tokens_per_s: float
    ms_per_step: float
    tokens_per_step: float
    launches_per_step: float | None = None
    device_ms_per_step: float | None = None
    break_even: float | None = None  # speculative rows with a plain row at the same bs
    profiled_ms_per_step: float | None = None  # wall time under the profiler (JSON only)
    # (kernel, launches/step, ms/step) of the costliest kernels (CUDA; JSON and --breakdown)
    top_kernels: tuple[tuple[str, float, float], ...] = ()
    gaps: DeviceGaps | None = None  # idle device time inside the profiled steps (CUDA)
    # the timed window (JSON only): its steps and the tokens all requests generated in it
    num_steps: int | None = None
    num_tokens: int | None = None
    replica_batch_sizes: tuple[int, ...] = ()  # data-parallel: each replica's share of bs
    # requests that finished (EOS, stop, context) while measured, and the first one's reason
    num_ended_early: int = 0
    ended_early_reason: str | None = None
    temperature: float = 0.0
    chosen: str | None = None  # the shape an adaptive engine ran most in the window
    # an adaptive engine's steps of each shape in the window, most first (JSON only)
    shape_steps: dict[str, int] = dataclasses.field(default_factory=dict)
    speedup: float | None = None  # tok/s ÷ the plain row's at the same bs and temperature
    step_ms: tuple[float, ...] = ()  # each timed step's wall time, in order (JSON only)
    # an adaptive engine's: the shape each one ran (with overlap: the step it read back)
    step_shapes: tuple[str, ...] = ()
    step_tokens: tuple[int, ...] = ()  # the tokens each step committed, all requests (JSON only)
    # each window's tok/s, in the order the prompts were drawn (JSON only): engines of one
    # interleaved run decoded the same draws, so their ratios pair window by window
    window_tokens_per_s: tuple[float, ...] = ()
    # an adaptive engine's policy after the window, per candidate: the tokens per step and ms
    # per step it expects at this batch size and temperature (JSON only; adaptive_state)
    policy_view: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # the same after each of the row's windows, in order (JSON only): what it believed as the
    # cell went on, where the last view alone may be one request's (bs 1) or one window's
    policy_windows: tuple[dict[str, dict[str, float]], ...] = ()

    @property
    def worst_over_median(self) -> float | None:
        """The longest timed step over the median one: 1 for even steps; above 3 a request
        saw a step longer than three median steps."""
        median = self._median_step_ms()
        return None if median is None else max(self.step_ms) / median

    @property
    def stalled_share(self) -> float | None:
        """The share of the timed steps' time spent in steps over 3 × the median one: what
        a host that stalled (or an engine that did) weighed on the row."""
        median = self._median_step_ms()
        if median is None:
            return None
        return sum(t for t in self.step_ms if t > 3 * median) / sum(self.step_ms)

    def _median_step_ms(self) -> float | None:
        """The median timed step, or None where no step was timed (or none took time)."""
        if not self.step_ms:
            return None
        median = statistics.median(self.step_ms)
        return median if median > 0 else None

    @property
    def device_busy(self) -> float | None:
        """Share of the (unprofiled) step wall time the device spent in kernels."""
        if self.device_ms_per_step is None or self.ms_per_step <= 0:
            return None
        return self.device_ms_per_step / self.ms_per_step


@dataclass(frozen=True, slots=True)
class HFRow:
    """transformers' ``generate`` at one batch size, compared with the engine's plain output."""

    batch_size: int
    tokens_per_s: float
    ms_per_token: float
    matching_share: float  # generated tokens before the first divergence, over all tokens

    @property
    def same_tokens(self) -> bool:
        return self.matching_share == 1.0


@dataclass(frozen=True, slots=True)
class FirstRequestRow:
    """One configuration's first request after its engine was built (cold) and the same
    request again (warm): one prompt of ``--prompt-len``, ``--new-tokens``, end to end."""

    config: str
    cold_ms: float
    warm_ms: float

    @property
    def cold_over_warm(self) -> float | None:
        return self.cold_ms / self.warm_ms if self.warm_ms > 0 else None


@dataclass(frozen=True, slots=True)
class ArrivalRow:
    """One arrivals run: ``batch_size`` background requests, one arrival every ``arrival_every``
    steps, ``num_arrivals`` in all; tok/s of every request over the window."""

    config: str
    prefill_step: str
    batch_size: int
    arrival_every: int
    num_arrivals: int
    tokens_per_s: float
    mean_ttft_ms: float
    num_steps: int
    num_tokens: int
    num_arrival_tokens: int
    num_prefill_only_steps: int
    ttft_ms: tuple[float, ...] = ()  # per arrival, in arrival order (JSON only)


def with_break_even(rows: Sequence[BenchRow], plain: str = "plain") -> list[BenchRow]:
    """``rows`` with ``break_even`` and ``speedup`` filled for every non-plain row that has a
    plain twin (same batch size and temperature)."""
    twins = {(r.batch_size, r.temperature): r for r in rows if r.config == plain}
    result = []
    for row in rows:
        base = twins.get((row.batch_size, row.temperature))
        if row.config != plain and base is not None and base.ms_per_step:
            row = dataclasses.replace(
                row,
                break_even=row.ms_per_step / base.ms_per_step,
                speedup=row.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None,
            )
        result.append(row)
    return result
