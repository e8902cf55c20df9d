"""`eagletree bench` end to end on the CPU, one run of the tiny preset read many ways: plain and a
tree at two batch sizes, the table, the JSON, the trace; repeats, small batches, interleaving."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from eagletree.app.cli import main as cli
from tests.integration.bench_cli.commands import TREE, bench, tiny_run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run over plain and a tree at bs 1 and 2: its exit status, streams and JSON."""
    tmp_path = tmp_path_factory.mktemp("bench")
    out, err = io.StringIO(), io.StringIO()  # capsys is per test: capture by hand
    argv = tiny_run(tmp_path, "--configs", "tree:S2,k2,N3", "--batch-sizes", "1", "2",
                    "--trace", str(tmp_path / "traces"))  # fmt: skip
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        patch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing goes to the user cache
        status = cli.main(["bench", *argv, "--out", str(tmp_path / "run")])
    data = json.loads((tmp_path / "run.json").read_text())
    return {
        "status": status,
        "out": out.getvalue(),
        "err": err.getvalue(),
        "json": data,
        "md": (tmp_path / "run.md").read_text(),
        "checkpoint": tmp_path / "checkpoint",
        "traces": tmp_path / "traces",
    }


def test_trace_writes_each_rows_profiled_steps_as_a_chrome_trace(report: dict[str, Any]) -> None:
    expected = {f"{config}-bs{bs}.json" for config in ("plain", "tree-S2-k2-N3") for bs in (1, 2)}
    assert {p.name for p in report["traces"].iterdir()} == expected
    for path in report["traces"].iterdir():
        events = json.loads(path.read_text())["traceEvents"]
        assert any(str(e.get("name", "")).startswith("aten::") for e in events), path


def test_bench_measures_every_configuration_at_every_batch_size(report: dict[str, Any]) -> None:
    assert report["status"] == 0, report["err"]
    rows = report["json"]["rows"]
    assert [(r["config"], r["batch_size"]) for r in rows] == [
        ("plain", 1), ("plain", 2), (TREE, 1), (TREE, 2),
    ]  # fmt: skip
    for row in rows:
        assert row["tokens_per_s"] > 0 and row["ms_per_step"] > 0
        assert row["tokens_per_step"] >= 1.0
        assert len(row["step_ms"]) == row["num_steps"] and row["worst_over_median"] >= 1.0
        assert row["launches_per_step"] > 0  # aten ops on the CPU
        assert row["device_ms_per_step"] is None and row["device_busy"] is None
    plain = {r["batch_size"]: r for r in rows if r["config"] == "plain"}
    for row in rows:
        if row["config"] == "plain":
            assert row["tokens_per_step"] == 1.0 and row["break_even"] is None
        else:
            expected = row["ms_per_step"] / plain[row["batch_size"]]["ms_per_step"]
            assert row["break_even"] == pytest.approx(expected)
    # a speculative step drafts, verifies a tree and re-extends: more ops than a plain one
    assert rows[2]["launches_per_step"] > rows[0]["launches_per_step"]


def test_the_json_records_the_settings_of_each_engine(report: dict[str, Any]) -> None:
    data = report["json"]
    assert data["device"] and data["torch"] and data["dtype"] == "float32"
    engines = data["settings"]["engines"]
    assert set(engines) == {"plain", TREE}
    assert engines["plain"]["speculative"]["algorithm"] == "none"
    tree = engines[TREE]["speculative"]
    assert (tree["algorithm"], tree["num_steps"], tree["eagle_topk"]) == ("eagle", 2, 2)
    assert tree["num_draft_tokens"] == 3
    assert engines[TREE]["model"]["device"] == "cpu"
    assert engines[TREE]["backend"]["attention"] == "torch"
    assert engines[TREE]["memory"]["max_running_requests"] == 2
    assert data["settings"]["argv"]["batch_sizes"] == [1, 2]


def test_the_markdown_table_is_printed_and_written(report: dict[str, Any]) -> None:
    assert report["out"] == report["md"]
    lines = report["md"].splitlines()
    assert lines[0].startswith("eagletree bench: ") and "torch " in lines[0]
    assert "aten ops/step" in lines[2]
    body = [line.split(" | ")[:2] for line in lines[4 : lines.index("", 4)]]
    assert body == [["| plain", "1"], ["| plain", "2"], [f"| {TREE}", "1"], [f"| {TREE}", "2"]]
    # then each engine's first request, cold and warm
    first = lines[lines.index("| config | cold ms | warm ms | cold ÷ warm |") + 2 :]
    assert [line.split(" | ")[0] for line in first] == ["| plain", f"| {TREE}"]
    # the progress bar: one finished line per (config, bs) on stderr, and the first-use notice
    finished = [line for line in report["err"].splitlines() if "tok/s" in line]
    assert len(finished) == 4 and all("4/4 tokens" in line for line in finished)
    assert "writing a random tiny" in report["err"]


@pytest.mark.hf
def test_a_second_run_reuses_the_preset_checkpoint_and_matches_transformers(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    checkpoint: Path = report["checkpoint"]
    argv = tiny_run(checkpoint.parent, "--configs", "plain", "--batch-sizes", "1", "--hf")
    status, out, err = bench(argv, capsys)
    assert status == 0, err
    assert "writing a random" not in err
    # transformers' greedy tokens equal the engine's plain tokens in float32
    assert "| 1 | " in out and out.rstrip().endswith("| yes |")


def test_repeats_measure_each_row_over_that_many_windows(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint: Path = report["checkpoint"]
    argv = tiny_run(checkpoint.parent, "--configs", "plain", "--batch-sizes", "2",
                    "--repeats", "3", "--out", str(checkpoint.parent / "repeats"))  # fmt: skip
    status, _, err = bench(argv, capsys)
    assert status == 0, err
    (row,) = json.loads((checkpoint.parent / "repeats.json").read_text())["rows"]
    once = next(r for r in report["json"]["rows"] if (r["config"], r["batch_size"]) == ("plain", 2))
    # three windows of 4 tokens for 2 requests, one step a token: three times one window's
    assert (row["num_tokens"], row["num_steps"]) == (3 * once["num_tokens"], 3 * once["num_steps"])
    assert len(row["step_ms"]) == row["num_steps"]


def test_small_batches_take_more_windows_until_a_row_holds_min_requests(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint: Path = report["checkpoint"]
    argv = tiny_run(checkpoint.parent, "--configs", "plain", "--batch-sizes", "1", "2",
                    "--min-requests", "3", "--out", str(checkpoint.parent / "least"))  # fmt: skip
    status, _, err = bench(argv, capsys)
    assert status == 0, err
    rows = json.loads((checkpoint.parent / "least.json").read_text())["rows"]
    once = {r["batch_size"]: r for r in report["json"]["rows"] if r["config"] == "plain"}
    # bs 1: three windows of one request; bs 2: two windows (4 requests, the first to hold 3)
    assert [r["num_tokens"] for r in rows] == [3 * once[1]["num_tokens"], 2 * once[2]["num_tokens"]]
    # one progress bar a row, over all its windows' tokens
    finished = [line for line in err.splitlines() if "tok/s" in line]
    assert len(finished) == 2
    assert "12/12 tokens" in finished[0] and "8/8 tokens" in finished[1]


def test_interleaved_engines_decode_what_engines_measured_in_turn_decode(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint: Path = report["checkpoint"]
    out = checkpoint.parent / "together"
    argv = tiny_run(checkpoint.parent, "--configs", "tree:S2,k2,N3", "--batch-sizes", "1", "2",
                    "--repeats", "2", "--interleave", "--out", str(out))  # fmt: skip
    status, _, err = bench(argv, capsys)
    assert status == 0, err
    data = json.loads(out.with_suffix(".json").read_text())
    assert "engines interleaved" in data["title"]
    # greedy, the same prompts: each engine's windows are what it decodes alone (two of them
    # here, one in the module's run), whichever engine ran between them
    in_turn = {(r["config"], r["batch_size"]): r for r in report["json"]["rows"]}
    rows = data["rows"]
    assert [(r["config"], r["batch_size"]) for r in rows] == list(in_turn)
    for row in rows:
        once = in_turn[(row["config"], row["batch_size"])]
        assert row["num_tokens"] == 2 * once["num_tokens"]
        assert row["num_steps"] == 2 * once["num_steps"]
        assert row["tokens_per_step"] == pytest.approx(once["tokens_per_step"])
        # (the random tiny pair accepts few drafts: the ops a profiled step runs tell a tree's
        # engine from plain decoding's)
        assert row["launches_per_step"] == once["launches_per_step"]
    assert [f["config"] for f in data["first_requests"]] == ["plain", TREE]
    # one progress bar a cell over both engines' windows, then a line per engine
    bars = [line for line in err.splitlines() if "interleaved" in line]
    assert len(bars) == 2 and all("2 engines" in bar for bar in bars)
    assert "16/16 tokens" in bars[0]  # bs 1: 2 engines x 2 windows x 4 tokens
    finished = [line for line in err.splitlines() if line.endswith("ms/step")]
    assert [line.split()[0] for line in finished] == ["plain", "tree", "plain", "tree"]
