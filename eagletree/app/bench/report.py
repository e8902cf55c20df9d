"""Application: the rows of `eagletree bench` and their markdown and JSON forms.

A row is one (configuration, batch size). ``break_even`` is the speculative row's step time
divided by the plain row's at the same batch size: the mean acceptance length at which
speculation starts to pay. On the CPU the launch column counts top-level aten operators and
there is no device time, so those columns are named and filled accordingly. With
``--arrivals`` a row is one (configuration, batch size, prefill step) of the arrivals mode
(``ArrivalRow``, ``render_arrivals_markdown``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagletree.app.bench.device_gaps import SHORT_GAP_US, DeviceGaps


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
    # an adaptive engine's policy after the window, per candidate: the tokens per step and ms
    # per step it expects at this batch size and temperature (JSON only; adaptive_state)
    policy_view: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def worst_over_median(self) -> float | None:
        """The longest timed step over the median one: 1 for even steps; above 3 a request
        saw a step longer than three median steps."""
        if not self.step_ms or statistics.median(self.step_ms) <= 0:
            return None
        return max(self.step_ms) / statistics.median(self.step_ms)

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


def render_markdown(
    header: str,
    rows: Sequence[BenchRow],
    hf_rows: Sequence[HFRow] = (),
    cuda: bool = True,
    breakdown: bool = False,
    first_requests: Sequence[FirstRequestRow] = (),
) -> str:
    """The header line, the main table, (when given) the first requests' and transformers'
    tables and, with ``breakdown``, each row's costliest kernels."""
    launches = "kernels/step" if cuda else "aten ops/step"
    sampled = any(r.temperature for r in rows)
    lines = [
        header,
        "",
        f"| config | bs |{' T |' if sampled else ''} tok/s | ÷ plain | ms/step | worst ÷ median "
        f"step | tokens/step | {launches} | GPU ms/step | GPU busy | break-even τ |",
        "|---|---|" + ("---|" if sampled else "") + "---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        config = r.config if r.chosen is None else f"{r.config} ({_mostly(r)})"
        cells = [
            config,
            str(r.batch_size),
            *([f"{r.temperature:g}"] if sampled else []),
            _number(r.tokens_per_s),
            "—" if r.config == "plain" else _ratio(r.speedup),
            _number(r.ms_per_step),
            _ratio(r.worst_over_median),
            f"{r.tokens_per_step:.2f}",
            "n/a" if r.launches_per_step is None else f"{r.launches_per_step:.0f}",
            "n/a" if r.device_ms_per_step is None else f"{r.device_ms_per_step:.2f}",
            "n/a" if r.device_busy is None else f"{r.device_busy:.0%}",
            "—" if r.config == "plain" else _ratio(r.break_even),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ended = [r for r in rows if r.num_ended_early]
    if ended:
        lines.append("")
    for r in ended:
        lines.append(
            f"`{r.config}` at bs {r.batch_size}: {r.num_ended_early} request(s) ended early "
            f"({r.ended_early_reason}) while measured; the later steps ran a smaller batch."
        )
    lines += _first_request_lines(first_requests)
    if hf_rows:
        lines += [
            "",
            "transformers `generate` on the same checkpoint (greedy, prefill included):",
            "",
            "| bs | tok/s | ms/token | same tokens as plain |",
            "|---|---|---|---|",
        ]
        for h in hf_rows:
            same = "yes" if h.same_tokens else f"no ({h.matching_share:.0%} before divergence)"
            cells = [str(h.batch_size), _number(h.tokens_per_s), _number(h.ms_per_token), same]
            lines.append("| " + " | ".join(cells) + " |")
    for r in rows if breakdown else ():
        if not r.top_kernels:
            continue
        lines += ["", f"Costliest kernels of `{r.config}` at bs {r.batch_size}:", ""]
        lines += ["| kernel | launches/step | ms/step |", "|---|---|---|"]
        for name, calls, ms in r.top_kernels:
            lines.append(f"| `{name}` | {calls:.0f} | {ms:.3f} |")
        if r.gaps is not None:
            lines += ["", _gaps_line(r.gaps)]
    return "\n".join(lines) + "\n"


def _first_request_lines(rows: Sequence[FirstRequestRow]) -> list[str]:
    """The table of each engine's first request against the same request warm (no lines
    when none was measured)."""
    if not rows:
        return []
    lines = [
        "",
        "First request of each new engine (one prompt, end to end) and the same request again:",
        "",
        "| config | cold ms | warm ms | cold ÷ warm |",
        "|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.config, _number(r.cold_ms), _number(r.warm_ms), _ratio(r.cold_over_warm)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_arrivals_markdown(
    header: str, rows: Sequence[ArrivalRow], first_requests: Sequence[FirstRequestRow] = ()
) -> str:
    """The header line, one table row per arrivals run, and (when given) the first requests'
    table."""
    lines = [
        header,
        "",
        "| config | prefill step | bs | arrival every | arrivals | tok/s | mean TTFT ms | steps "
        "| lone prefill steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            r.config,
            r.prefill_step,
            str(r.batch_size),
            f"{r.arrival_every} steps",
            str(r.num_arrivals),
            _number(r.tokens_per_s),
            _number(r.mean_ttft_ms),
            str(r.num_steps),
            str(r.num_prefill_only_steps),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _first_request_lines(first_requests)
    return "\n".join(lines) + "\n"


def report_json(
    header: Mapping[str, Any],
    rows: Sequence[BenchRow | ArrivalRow],
    hf_rows: Sequence[HFRow],
    settings: Mapping[str, Any],
    first_requests: Sequence[FirstRequestRow] = (),
    adaptive: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the markdown shows, unrounded, plus the settings each engine was built from
    and what each adaptive engine measured and learned (``adaptive_state.adaptive_state``)."""
    return {
        **header,
        "rows": [
            {
                **dataclasses.asdict(r),
                "device_busy": r.device_busy,
                "worst_over_median": r.worst_over_median,
            }
            if isinstance(r, BenchRow)
            else dataclasses.asdict(r)
            for r in rows
        ],
        "hf": [{**dataclasses.asdict(h), "same_tokens": h.same_tokens} for h in hf_rows],
        "first_requests": [
            {**dataclasses.asdict(f), "cold_over_warm": f.cold_over_warm} for f in first_requests
        ],
        "settings": dict(settings),
        "adaptive": dict(adaptive or {}),
    }


def write_report(path: Path, markdown: str, data: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``PATH.md`` and ``PATH.json``; a trailing .md or .json on PATH is dropped first."""
    base = path.with_suffix("") if path.suffix in (".md", ".json") else path
    base.parent.mkdir(parents=True, exist_ok=True)
    md, js = base.with_name(base.name + ".md"), base.with_name(base.name + ".json")
    md.write_text(markdown)
    js.write_text(json.dumps(data, indent=2) + "\n")
    return md, js


def _mostly(row: BenchRow) -> str:
    """``mostly SHAPE`` with its share of the window's steps, when they were counted."""
    total = sum(row.shape_steps.values())
    if not total or row.chosen not in row.shape_steps:
        return f"mostly {row.chosen}"
    return f"mostly {row.chosen}, {100 * row.shape_steps[row.chosen] / total:.0f} %"


def _gaps_line(gaps: DeviceGaps) -> str:
    """One sentence: the profiled step's idle device time, between kernels and waiting."""
    after = ", ".join(f"`{name}` {ms:.3f} ms" for name, ms in gaps.waits_after)
    return (
        f"Device idle per profiled step: {gaps.between_kernels_ms:.3f} ms in"
        f" {gaps.between_kernels:.0f} gaps of ≤ {SHORT_GAP_US:g} µs between activities,"
        f" {gaps.host_wait_ms:.3f} ms in {gaps.host_waits:.1f} longer waits"
        + (f" (after {after})." if after else ".")
    )


def _number(value: float) -> str:
    """Three significant figures or so: 30.3, 132, 0.512."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
