"""The adaptive policy's table in a bench report: each cell's ratios against the best fixed
drafting shape and plain decoding, what it ran, its worst step, and the geometric means."""

from __future__ import annotations

import math
import statistics

from eagletree.app.bench.adaptive_table import adaptive_lines
from eagletree.app.bench.rows import BenchRow


def _row(config: str, bs: int, temperature: float, tok_s: float, **extra: object) -> BenchRow:
    return BenchRow(config, bs, tok_s, 1.0, 1.0, temperature=temperature, **extra)  # type: ignore[arg-type]


def test_each_cell_divides_the_adaptive_engine_by_the_best_fixed_shape_and_by_plain() -> None:
    rows = [
        _row("plain", 1, 0.0, 100.0, step_ms=(1.0, 1.0, 4.0)),
        _row("chain S3", 1, 0.0, 250.0),
        _row("tree S5 k4 N16", 1, 0.0, 300.0),
        _row("adaptive", 1, 0.0, 270.0, shape_steps={"tree S5 k4 N16": 30, "chain S3": 10},
             step_ms=(1.0, 1.0, 2.5)),
        _row("plain", 8, 1.0, 800.0),
        _row("chain S3", 8, 1.0, 600.0),
        _row("tree S5 k4 N16", 8, 1.0, 400.0),
        _row("adaptive", 8, 1.0, 760.0,
             shape_steps={"plain": 95, "chain S3": 4, "tree S5 k4 N16": 1}),
    ]  # fmt: skip
    lines = adaptive_lines(rows)
    cells = [line for line in lines if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert cells == [
        "| 0 | 1 | 0.90 (tree S5 k4 N16) | n/a | 2.70 | tree S5 k4 N16 75 %, chain S3 25 % "
        "| 2.50 (4.00) |",
        "| 1 | 8 | 1.27 (chain S3) | n/a | 0.95 | plain 95 %, chain S3 4 % | n/a (n/a) |",
    ]
    # ÷ the best fixed engine of each cell, plain included: 300 at bs 1, 800 at bs 8
    means = lines[-1]
    expected = {
        "adaptive": math.sqrt(270 / 300 * 760 / 800),
        "plain": math.sqrt(100 / 300 * 1.0),
        "chain S3": math.sqrt(250 / 300 * 600 / 800),
        "tree S5 k4 N16": math.sqrt(1.0 * 400 / 800),
    }
    order = sorted(expected, key=lambda name: -expected[name])
    assert means == (
        "Geometric mean over the 2 cells of tok/s ÷ the cell's best fixed engine: "
        + ", ".join(f"{name} {expected[name]:.3f}" for name in order)
        + "."
    )


def test_a_run_without_the_adaptive_policy_adds_nothing() -> None:
    assert adaptive_lines([_row("plain", 1, 0.0, 100.0), _row("chain S3", 1, 0.0, 200.0)]) == []


def test_a_configuration_missing_from_some_cell_has_no_mean() -> None:
    rows = [
        _row("plain", 1, 0.0, 100.0),
        _row("adaptive", 1, 0.0, 150.0),
        _row("plain", 8, 0.0, 400.0),
        _row("chain S3", 8, 0.0, 800.0),
        _row("adaptive", 8, 0.0, 600.0),
    ]
    lines = adaptive_lines(rows)
    assert (
        "| 0 | 1 | n/a | n/a | 1.50 | n/a | n/a (n/a) |" in lines
    )  # no drafting shape to compare with
    assert "chain S3" not in lines[-1]
    assert lines[-1].startswith("Geometric mean over the 2 cells")
    assert f"adaptive {math.sqrt(1.5 * 0.75):.3f}" in lines[-1]


def test_a_ratio_over_paired_windows_carries_its_standard_error() -> None:
    # two draws: the adaptive engine 10 % under and 10 % over the chain's, window by window
    rows = [
        _row("plain", 8, 1.0, 50.0, window_tokens_per_s=(50.0, 50.0)),
        _row("chain S3", 8, 1.0, 100.0, window_tokens_per_s=(100.0, 100.0)),
        _row("adaptive", 8, 1.0, 100.0, window_tokens_per_s=(90.0, 110.0)),
    ]
    lines = adaptive_lines(rows)
    # two logs a and b: their standard deviation is |a - b| / √2, its error over √2 more
    error = abs(math.log(110 / 90)) / 2
    assert f"| 1 | 8 | 1.00 ± {error:.2f} (chain S3) | n/a | 2.00 ± {2 * error:.2f} |" in lines[5]
    assert any(line.startswith("± is the standard error") for line in lines)


def test_rows_not_measured_over_the_same_draws_carry_no_error() -> None:
    rows = [
        _row("plain", 1, 0.0, 100.0, window_tokens_per_s=(100.0,)),
        _row("chain S3", 1, 0.0, 200.0, window_tokens_per_s=(180.0, 220.0, 200.0)),
        _row("adaptive", 1, 0.0, 190.0, window_tokens_per_s=(170.0, 210.0)),
    ]
    lines = adaptive_lines(rows)
    assert "| 0 | 1 | 0.95 (chain S3) | n/a | 1.90 | n/a | n/a (n/a) |" in lines
    assert not any("±" in line for line in lines)


def test_the_median_draw_ratio_is_not_moved_by_a_stall_in_one_window() -> None:
    # five draws: the adaptive engine 10 % under the chain in one, level in three, and the
    # chain's fifth window stalled to half its rate; the totals' ratio takes the stall, the
    # median of the draws' ratios (0.9, 1, 1, 1, 2) does not
    chain = (100.0, 100.0, 100.0, 100.0, 50.0)
    adaptive = (90.0, 100.0, 100.0, 100.0, 100.0)
    rows = [
        _row("plain", 32, 0.7, 50.0, window_tokens_per_s=(50.0,) * 5),
        _row("chain S3", 32, 0.7, 90.0, window_tokens_per_s=chain),
        _row("adaptive", 32, 0.7, 99.0, window_tokens_per_s=adaptive),
    ]
    (cell,) = [line for line in adaptive_lines(rows) if line.startswith("| 0.7 | 32 |")]
    logs = [math.log(a / c) for a, c in zip(adaptive, chain, strict=True)]
    error = 99.0 / 90.0 * statistics.stdev(logs) / math.sqrt(5)
    assert cell.split(" | ")[2:4] == [f"1.10 ± {error:.2f} (chain S3)", "1.00"]
