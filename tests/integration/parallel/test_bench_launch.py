"""``eagletree bench --tp 2`` on the CPU: two spawned ranks measure the tiny preset's plain and
tree engines tensor-parallel (each rank's engine really sharded: the recorded settings say
``tp_size`` 2 and the ranks would deadlock otherwise), rank 0 alone prints the table and writes
the report; the preset is written once, by rank 0, before the others read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagletree.app import bench_cli

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")


def test_bench_with_tp_2_measures_on_two_ranks_and_reports_once(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "eagletree.app.cli", "bench", "--tp", "2",
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


def test_bench_refuses_hf_with_tp(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_cli.main(["--tp", "2", "--hf"])
    assert exit_.value.code == 2
    assert "--hf times transformers in one process" in capsys.readouterr().err
