"""Application: the markdown and JSON forms of `eagletree bench`'s rows (``rows``).

On the CPU the launch column counts top-level aten operators and there is no device time, so
those columns are named and filled accordingly. The arrivals mode has its own table
(``render_arrivals_markdown``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagletree.app.bench.device_gaps import SHORT_GAP_US, DeviceGaps
from eagletree.app.bench.rows import ArrivalRow, BenchRow, FirstRequestRow, HFRow


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
    lines += _stalled_lines(rows)
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


def _stalled_lines(rows: Sequence[BenchRow]) -> list[str]:
    """A line naming the rows where steps over 3 × the median took 5 % or more of the time."""
    stalled = [r for r in rows if (r.stalled_share or 0.0) >= 0.05]
    if not stalled:
        return []
    named = ", ".join(
        f"`{r.config}` bs {r.batch_size}{f' T {r.temperature:g}' if r.temperature else ''} "
        f"{r.stalled_share:.0%}"
        for r in stalled
    )
    return [
        "",
        f"Steps over 3 × their row's median took 5 % or more of these rows' time: {named} (a "
        "host that stalled, or an engine that did; rows measured apart meet different stalls, "
        "and `--interleave` has the rows of a cell share them).",
    ]


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
                "stalled_share": r.stalled_share,
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
