"""``eagletree bench --tp 2`` on the CPU: two spawned ranks measure the tiny preset's plain and
tree engines tensor-parallel (each rank's engine really sharded: the recorded settings say
``tp_size`` 2 and the ranks would deadlock otherwise), rank 0 alone prints the table and writes
the report; the preset is written once, by rank 0, before the others read it. ``bench --dp 2``
spreads each batch over two replicas stepping in lockstep: every row's window (steps, tokens,
tokens per step) is the one a single process measures over the whole batch, also at bs 1 (one
replica idle)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagletree.app.bench import cli as bench_cli
from eagletree.app.parallel.router import route_by_load

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

PROMPT_LEN = 8


# whole bench runs on spawned ranks, 15 s each: the slow lane (README); the refused flags stay
@pytest.mark.slow
def test_bench_with_tp_2_measures_on_two_ranks_and_reports_once(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "eagletree.app.cli.main", "bench", "--tp", "2",
        "--preset", "tiny", "--checkpoint-dir", str(tmp_path / "checkpoint"),
        "--device", "cpu", "--attention", "torch", "--kv-move", "torch",
        "--configs", "plain", "tree:S2,k2,N3", "--batch-sizes", "2",
        "--prompt-len", "8", "--new-tokens", "4", "--warmup-steps", "1", "--profile-steps", "0",
        "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    rows = {(row["config"], row["batch_size"]): row for row in report["rows"]}
    assert set(rows) == {("plain", 2), ("tree S2 k2 N3", 2)}
    assert all(row["tokens_per_s"] > 0 for row in rows.values())
    assert rows[("plain", 2)]["tokens_per_step"] == pytest.approx(1.0)  # per request
    engines = report["settings"]["engines"]
    assert {engine["parallel"]["tp_size"] for engine in engines.values()} == {2}
    assert ", tp 2, " in report["title"]
    # the table's title and each row's progress, from rank 0 alone
    assert done.stdout.count("eagletree bench:") == 1
    assert done.stderr.count("4/4 tokens") == len(rows)
    assert (tmp_path / "run.md").read_text().count("eagletree bench:") == 1


@pytest.mark.slow
def test_bench_with_dp_2_measures_the_batch_over_both_replicas(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    common = [
        sys.executable, "-m", "eagletree.app.cli.main", "bench",
        "--preset", "tiny", "--checkpoint-dir", str(tmp_path / "checkpoint"),
        "--device", "cpu", "--attention", "torch", "--kv-move", "torch",
        "--configs", "plain", "tree:S2,k2,N3", "--batch-sizes", "1", "3",
        "--prompt-len", str(PROMPT_LEN), "--new-tokens", "4", "--warmup-steps", "1",
        "--profile-steps", "1",
    ]  # fmt: skip
    reports = {}
    for name, flags in (("single", []), ("dp", ["--dp", "2"])):
        out = tmp_path / name
        command = [*common, *flags, "--out", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        reports[name] = json.loads(out.with_suffix(".json").read_text())
        assert done.stdout.count("eagletree bench:") == 1  # rank 0 alone prints
    single, parallel = (
        {(r["config"], r["batch_size"]): r for r in reports[n]["rows"]} for n in reports
    )
    assert (
        set(parallel)
        == set(single)
        == {(c, bs) for c in ("plain", "tree S2 k2 N3") for bs in (1, 3)}
    )
    for key, row in parallel.items():
        # the group's window is the single process's: the same steps and tokens, request by
        # request (greedy), though each replica ran only its share of the batch
        for field in ("num_steps", "num_tokens", "tokens_per_step"):
            assert row[field] == single[key][field], (key, field)
        seconds = row["ms_per_step"] * row["num_steps"] / 1000
        assert row["tokens_per_s"] == pytest.approx(row["num_tokens"] / seconds)
        assert row["launches_per_step"] > 0  # rank 0's profile
    for bs in (1, 3):  # plain: one token per request and step, every request through the window
        assert parallel[("plain", bs)]["num_tokens"] == bs * parallel[("plain", bs)]["num_steps"]
    for (_, bs), row in parallel.items():  # the router's split of the batch over idle replicas
        placement = route_by_load([PROMPT_LEN] * bs, [0, 0])
        assert row["replica_batch_sizes"] == [placement.count(r) for r in (0, 1)]
        assert single[(_, bs)]["replica_batch_sizes"] == []
    engines = reports["dp"]["settings"]["engines"]
    assert {engine["parallel"]["dp_size"] for engine in engines.values()} == {2}
    assert ", dp 2, " in reports["dp"]["title"]


@pytest.mark.parametrize("flag", ["--tp", "--dp"])
def test_bench_refuses_hf_with_parallel_ranks(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_cli.main([flag, "2", "--hf"])
    assert exit_.value.code == 2
    assert (
        f"--hf times transformers in one process: run it without {flag}" in capsys.readouterr().err
    )
