"""benchmarks/shape_steps.py: each shape's steps inside an adaptive row against the fixed rows,
and the bs-1 persistence of a fixed engine's tokens a step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import shape_steps
from benchmarks.shape_steps import lag_one


def _row(
    config: str, batch_size: int, ms: list[float], tokens: list[int], **more: object
) -> dict[str, object]:
    return {"config": config, "batch_size": batch_size, "temperature": 0.7, "step_ms": ms,
            "step_tokens": tokens, "replica_batch_sizes": [batch_size], **more}  # fmt: skip


def test_an_adaptive_rows_steps_are_split_by_shape_tokens_a_request() -> None:
    row = _row(
        "adaptive", 2, [1.0, 1.4, 1.2, 0.6, 1.6],
        [6, 9, 5, 2, 11], step_shapes=["chain S3", "chain S5", "chain S3", "plain", "chain S5"],
    )  # fmt: skip
    steps = {s.label: s for s in shape_steps.shape_steps(row)}
    assert [s.label for s in shape_steps.shape_steps(row)] == ["chain S3", "chain S5", "plain"]
    s3, s5, plain = steps["chain S3"], steps["chain S5"], steps["plain"]
    assert s3.steps == 2
    assert s3.share == pytest.approx(0.4)
    assert s3.median_ms == pytest.approx(1.1)
    assert s5.median_ms == pytest.approx(1.5)
    # (6 + 5) tokens over 2 steps of a batch of 2 requests
    assert s3.tokens_per_step == pytest.approx(11 / 2 / 2)
    assert s5.tokens_per_step == pytest.approx(20 / 2 / 2)
    assert plain.tokens_per_step == pytest.approx(1.0)
    # a row written before step_tokens was recorded
    del row["step_tokens"]
    assert all(s.tokens_per_step is None for s in shape_steps.shape_steps(row))


def test_lag_one_is_the_autocorrelation_of_successive_values() -> None:
    assert lag_one([1, 3, 1, 3, 1, 3]) == pytest.approx(-5 / 6)  # alternating
    assert lag_one([1, 1, 1, 3, 3, 3]) == pytest.approx(0.5)  # runs of three: (4 − 1) / 6
    assert lag_one([2, 2, 2]) is None and lag_one([1, 2]) is None


def test_the_report_sets_each_adaptive_shape_beside_its_fixed_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        _row("chain S3", 1, [0.8, 0.8, 0.8, 0.8], [3, 3, 2, 2]),
        _row("plain", 1, [0.4, 0.4], [1, 1]),
        _row("adaptive", 1, [0.7, 0.8, 1.2, 1.0], [4, 3, 4, 4],
             step_shapes=["chain S3", "chain S3", "chain S3", "chain S5"]),
    ]  # fmt: skip
    run = tmp_path / "all.json"
    run.write_text(json.dumps({"rows": rows}))
    assert shape_steps.main(["--run", str(run), "--out", str(tmp_path / "out.md")]) == 0
    printed = capsys.readouterr().out
    # its chain S3 steps: the fixed engine's median, a mean a tenth longer
    assert "| 0.7 | 1 | chain S3 | 75% | 0.800 | 0.900 | 3.67 | 0.800 | 0.800 | 2.50 |" in printed
    assert "| 0.7 | 1 | chain S5 | 25% | 1.000 | 1.000 | 4.00 | — | — | — |" in printed
    # chain S3's 3, 3, 2, 2: mean 2.5, lag-1 (0.25 − 0.25 + 0.25) / 1
    assert "- T 0.7, chain S3: +0.25" in printed
    assert "plain:" not in printed  # plain commits one token a step: nothing persists
    assert (tmp_path / "out.md").read_text() == printed
