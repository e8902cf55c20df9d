"""Application: the adaptive engine against the fixed ones of the same run, cell by cell.

A bench run with ``--policy adaptive`` measures plain decoding, each fixed shape and the adaptive
policy over them at every (batch size, temperature). What a reader asks of it — is the policy
at least as fast as plain decoding, how close is it to the best fixed shape of each cell, what
did it run, does any request see a stall — is one division per cell, done here once, so that
every run's report answers it the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from eagletree.app.bench.configs import ADAPTIVE_NAME, PLAIN
from eagletree.app.bench.rows import BenchRow


def adaptive_lines(rows: Sequence[BenchRow]) -> list[str]:
    """Markdown lines (empty without an adaptive row): per (temperature, batch size) the
    adaptive engine's tok/s over the best fixed drafting shape's (named) and over plain
    decoding's, each with its standard error where both rows measured the same draws of
    prompts (``paired_error``) and the median of the draws' ratios to the best
    (``median_draw_ratio``), the two shapes it ran most with their shares of its steps and
    its worst over median step (and plain decoding's); then, per configuration, the geometric
    mean over the cells of its tok/s over the cell's best fixed engine (plain included)."""
    cells: dict[tuple[float, int], dict[str, BenchRow]] = {}
    for row in rows:
        cells.setdefault((row.temperature, row.batch_size), {})[row.config] = row
    measured = {key: cell for key, cell in sorted(cells.items()) if ADAPTIVE_NAME in cell}
    if not measured:
        return []
    lines = [
        "",
        "The adaptive policy against the fixed configurations of each cell:",
        "",
        "| T | bs | ÷ best fixed shape (which) | median draw | ÷ plain | ran (share of its "
        "steps) | worst ÷ median step (plain's) |",
        "|---|---|---|---|---|---|---|",
    ]
    paired = False
    over_best: dict[str, list[float]] = {}
    for (temperature, batch_size), cell in measured.items():
        adaptive = cell[ADAPTIVE_NAME]
        fixed = {name: row for name, row in cell.items() if name != ADAPTIVE_NAME}
        drafting = [row for name, row in fixed.items() if name != PLAIN.name]
        best = max(drafting, key=lambda r: r.tokens_per_s, default=None)
        plain = fixed.get(PLAIN.name)
        paired = paired or any(paired_error(adaptive, b) is not None for b in (best, plain))
        median = median_draw_ratio(adaptive, best)
        lines.append(
            f"| {temperature:g} | {batch_size} | {_over(adaptive, best, named=True)} "
            f"| {'n/a' if median is None else f'{median:.2f}'} | {_over(adaptive, plain)} "
            f"| {_ran(adaptive)} | {_worst(adaptive)} ({_worst(plain)}) |"
        )
        if fixed:
            top = max(row.tokens_per_s for row in fixed.values())
            for name, row in cell.items():
                over_best.setdefault(name, []).append(row.tokens_per_s / top)
    if paired:
        lines += [
            "",
            "± is the standard error of the ratio from its windows: both engines decoded each "
            "draw of prompts, so a draw's text, easy or hard, weighs on both alike. The median "
            "draw is the median over the draws of the two engines' ratio: a host stall lands in "
            "one engine's window of a draw, which moves the ratio of the totals by the stall's "
            "length and the median by one draw at most. The worst ÷ median step of plain "
            "decoding in the same cell tells the host's stalls from the policy's.",
        ]
    complete = {name: ratios for name, ratios in over_best.items() if len(ratios) == len(measured)}
    if complete:
        means = sorted(
            ((statistics.geometric_mean(ratios), name) for name, ratios in complete.items()),
            reverse=True,
        )
        lines += [
            "",
            f"Geometric mean over the {len(measured)} cells of tok/s ÷ the cell's best fixed "
            "engine: " + ", ".join(f"{name} {mean:.3f}" for mean, name in means) + ".",
        ]
    return lines


def paired_error(row: BenchRow, base: BenchRow | None) -> float | None:
    """The standard error of log(``row`` ÷ ``base``) tok/s over the windows both measured, draw
    by draw (None for fewer than two windows, or rows not measured over the same draws): at
    T > 0 a row's tokens per step move by a few per cent between runs with the text its
    requests happened to write, and a ratio is a miss only where it stands clear of that."""
    ratios = _draw_ratios(row, base, least=2)
    if ratios is None:
        return None
    logs = [math.log(ratio) for ratio in ratios]
    return statistics.stdev(logs) / math.sqrt(len(logs))


def median_draw_ratio(row: BenchRow, base: BenchRow | None) -> float | None:
    """The median over the draws of prompts both rows decoded of ``row``'s tok/s ÷ ``base``'s
    (None for fewer than three draws, or rows not measured over the same draws)."""
    ratios = _draw_ratios(row, base, least=3)
    return None if ratios is None else statistics.median(ratios)


def _draw_ratios(row: BenchRow, base: BenchRow | None, *, least: int) -> list[float] | None:
    """``row``'s tok/s ÷ ``base``'s, draw by draw, where both measured the same ``least`` draws
    or more (else None)."""
    if base is None:
        return None
    ours, theirs = row.window_tokens_per_s, base.window_tokens_per_s
    if len(ours) < least or len(ours) != len(theirs) or min(*ours, *theirs) <= 0:
        return None
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def _over(row: BenchRow, base: BenchRow | None, named: bool = False) -> str:
    if base is None or base.tokens_per_s <= 0:
        return "n/a"
    ratio = row.tokens_per_s / base.tokens_per_s
    error = paired_error(row, base)
    shown = f"{ratio:.2f}" if error is None else f"{ratio:.2f} ± {ratio * error:.2f}"
    return f"{shown} ({base.config})" if named else shown


def _ran(row: BenchRow) -> str:
    total = sum(row.shape_steps.values())
    if not total:
        return "n/a"
    most = sorted(row.shape_steps.items(), key=lambda item: -item[1])[:2]
    return ", ".join(f"{shape} {100 * steps / total:.0f} %" for shape, steps in most)


def _worst(row: BenchRow | None) -> str:
    worst = None if row is None else row.worst_over_median
    return "n/a" if worst is None else f"{worst:.2f}"
