"""benchmarks/projected.py: one engine's step costs with another's acceptance, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import projected


def _bench(path: Path, adaptive: dict[str, object]) -> Path:
    path.write_text(json.dumps({"rows": [], "adaptive": {"adaptive": adaptive}}))
    return path


def _cost(
    shape: tuple[int, int, int], label: str, bucket: int, sampled: bool, ms: float
) -> dict[str, object]:
    s, k, n = shape
    return {"shape": label, "num_steps": s, "topk": k, "num_draft_tokens": n, "bucket": bucket,
            "sampled": sampled, "measured_ms": ms / 2, "learned_ms": ms}  # fmt: skip


def test_each_shape_is_priced_by_the_costs_and_the_other_engines_rates(tmp_path: Path) -> None:
    # plain 1 ms a step; chain S3 2 ms greedy, 2.5 ms sampled; at buckets 1 and 8
    costs = [
        _cost(shape, label, bucket, sampled, ms)
        for bucket in (1, 8)
        for sampled in (False, True)
        for shape, label, ms in (((0, 1, 1), "plain", 1.0),
                                 ((3, 1, 4), "chain S3", 2.5 if sampled else 2.0))
    ]  # fmt: skip
    cost_file = _bench(tmp_path / "costs.json", {"step_costs": costs, "rank_profiles": {}})
    rates = {"greedy": [[0.8]], "T>0.85": [[0.3]]}
    rate_file = _bench(tmp_path / "rates.json", {"step_costs": [], "rank_profiles": rates})
    out = tmp_path / "projected.md"
    projected.main(["--costs", str(cost_file), "--rates", str(rate_file), "--temperatures",
                    "0", "1", "--out", str(out)])  # fmt: skip
    rows = [line.split(" | ") for line in out.read_text().splitlines()[2:]]
    # greedy: 1 + 0.8 + 0.64 + 0.512 = 2.952 tokens in 2 ms against 1 in 1 ms
    # T 1: 1 + 0.3 + 0.09 + 0.027 = 1.417 tokens in 2.5 ms
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("| 0", "1", "1,000", "1.48"), ("| 0", "8", "8,000", "1.48"),
        ("| 1", "1", "1,000", "0.57"), ("| 1", "8", "8,000", "0.57"),
    ]  # fmt: skip
    assert rows[0][4] == "chain S3 (1.48) |" and rows[2][4] == "plain (1.00) |"
    # the replayed graphs alone: half the time for both, the same ratios
    projected.main(["--costs", str(cost_file), "--rates", str(rate_file), "--cost", "measured",
                    "--temperatures", "0", "--out", str(out)])  # fmt: skip
    assert out.read_text().splitlines()[2].split(" | ")[2:4] == ["2,000", "1.48"]


def test_a_runs_line_rates_price_its_chains(tmp_path: Path) -> None:
    # rank 0 was taken 0.6 of the time at depth 1 over every path, 0.9 along the line
    adaptive = {"rank_profiles": {"greedy": [[0.6, 0.2]]}, "line_rates": {"greedy": [0.9]}}
    profiles = projected.read_profiles(_bench(tmp_path / "run.json", adaptive))
    assert profiles["greedy"].chain_rate(2) == 0.9 and profiles["greedy"].rate(0, 0) == 0.6
    # a run from before line rates were kept: its chains by rank 0
    del adaptive["line_rates"]
    assert projected.read_profiles(_bench(tmp_path / "old.json", adaptive))["greedy"].chain_rate(
        0
    ) == pytest.approx(0.6)


def test_a_training_report_gives_the_greedy_and_sampled_profiles(tmp_path: Path) -> None:
    report = tmp_path / "training.json"
    report.write_text(json.dumps({"rank_profile": {"greedy": [[0.8]], "sampled": [[0.3]]}}))
    profiles = projected.read_profiles(report)
    assert profiles["greedy"] == profiles["T<=0.5"] and profiles["T<=0.85"] == profiles["T>0.85"]
    assert profiles["greedy"].rate(0, 0) == 0.8 and profiles["T>0.85"].rate(0, 0) == 0.3


def test_a_temperature_without_rates_is_refused_naming_what_there_is(tmp_path: Path) -> None:
    cost_file = _bench(tmp_path / "c.json", {"step_costs": [
        _cost((0, 1, 1), "plain", 1, True, 1.0)], "rank_profiles": {}})  # fmt: skip
    rate_file = _bench(
        tmp_path / "r.json", {"step_costs": [], "rank_profiles": {"greedy": [[0.5]]}}
    )
    with pytest.raises(
        SystemExit, match=r"no rank profile for T 0.7 \(band T<=0.85\); it has greedy"
    ):
        projected.main(
            ["--costs", str(cost_file), "--rates", str(rate_file), "--temperatures", "0.7"]
        )
