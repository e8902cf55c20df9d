"""`eagletree bench` end to end on the CPU: bad flags, arrivals, the tiny preset alone, the
adaptive policy beside fixed shapes, prompts from documents, an engine that does not fit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer
from eagletree.app.bench.adaptive_state import CATCH_UP
from eagletree.app.bench.checkpoints import ensure_preset_checkpoint
from eagletree.app.bench.cli import resolved_value
from eagletree.app.cli import main as cli
from tests.integration.bench_cli.commands import TREE, bench, tiny_run


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--configs", "tree:S5,k4"], 2, "bad --configs item 'tree:S5,k4': "),
        (["--batch-sizes", "0"], 2, "--batch-sizes must be at least 1"),
        (["--repeats", "0"], 2, "--repeats must be at least 1"),
        (["--min-requests", "0"], 2, "--min-requests must be at least 1"),
        (["--preset", "huge"], 2, "invalid choice: 'huge'"),
        (["--new-tokens", "many"], 2, "invalid int value: 'many'"),
        (["--draft-dir", "x"], 2, "--draft-dir needs --target"),
        (["--arrivals", "0"], 2, "--arrivals must be at least 1"),
        (["--arrivals", "2", "--hf"], 2, "run it without --arrivals"),
        (["--prefill-step", "with_decode", "alone"], 2, "compared by --arrivals K"),
        (["--prefill-step", "separate"], 2, "invalid choice: 'separate'"),
        (["--temperatures", "-1"], 2, "--temperatures must be >= 0"),
        (["--policy", "adaptive", "--configs", "plain"], 2, "needs a speculative config"),
        (["--policy", "adaptive", "--arrivals", "2"], 2, "decode window of one process group"),
        (["--interleave", "--arrivals", "2"], 2, "--interleave alternates decode windows"),
        (["--interleave", "--dp", "2"], 2, "run it without --tp and --dp"),
        (["--target", "/nonexistent/target", "--device", "cpu"], 1, "holds no config.json"),
        (["--prompts", "/nonexistent/held.jsonl"], 2, "--prompts /nonexistent/held.jsonl does not"),
    ],
)
def test_bad_flags_end_in_one_line_and_an_exit_status(
    argv: list[str], status: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: int | str | None
    try:
        code = cli.main(["bench", *argv])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code == status
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in captured.err


def test_the_arrivals_mode_counts_its_arrivals_tokens_and_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain decoding, synchronous on the CPU: every background request emits one token a step
    it decodes, every arrival exactly --new-tokens, and the last arrival (arriving
    (A - 1)·K steps in) ends the window after --new-tokens more steps."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    every, num_arrivals, new_tokens = 3, 3, 4
    argv = tiny_run(
        tmp_path, "--configs", "plain", "--batch-sizes", "1", "2",
        "--arrivals", str(every), "--num-arrivals", str(num_arrivals),
        "--prefill-step", "with_decode", "alone", "--out", str(tmp_path / "arrivals"),
    )  # fmt: skip
    assert argv[argv.index("--new-tokens") + 1] == str(new_tokens)
    status, out, err = bench(argv, capsys)
    assert status == 0, err
    rows = json.loads((tmp_path / "arrivals.json").read_text())["rows"]
    assert [(r["batch_size"], r["prefill_step"]) for r in rows] == [
        (1, "with_decode"), (1, "alone"), (2, "with_decode"), (2, "alone"),
    ]  # fmt: skip
    for row in rows:
        assert row["num_arrivals"] == num_arrivals == len(row["ttft_ms"])
        assert row["num_arrival_tokens"] == num_arrivals * new_tokens
        assert row["num_steps"] == (num_arrivals - 1) * every + new_tokens
        lone = row["num_prefill_only_steps"]
        assert lone == (num_arrivals if row["prefill_step"] == "alone" else 0)
        background = row["batch_size"] * (row["num_steps"] - lone)
        assert row["num_tokens"] == background + row["num_arrival_tokens"]
        assert row["tokens_per_s"] > 0 and min(row["ttft_ms"]) > 0
        assert row["mean_ttft_ms"] == pytest.approx(sum(row["ttft_ms"]) / num_arrivals)
        assert f"| plain | {row['prefill_step']} | {row['batch_size']} | {every} steps |" in out


def test_the_tiny_preset_with_no_other_flag_prints_its_table_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command as a new user types it: its defaults fit the CPU, and no request the
    engine drafts far ahead runs out of budget while the slower ones are measured."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    status, out, err = bench(["--preset", "tiny"], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert "auto" not in lines[0]  # the values each engine resolved
    if not torch.cuda.is_available():
        assert "cuda_graph off, overlap off" in lines[0]
    assert "prompt 32, new tokens 16" in lines[0]
    body = [line.split(" | ")[:2] for line in lines[4 : lines.index("", 4)]]
    configs = ["plain", "chain S3", "tree S5 k4 N8"]
    assert body == [[f"| {c}", str(bs)] for c in configs for bs in (1, 4)]
    assert "ended early" not in out and "error" not in err


def test_the_header_names_each_engines_resolved_value_when_they_differ() -> None:
    engines = {
        "plain": {"scheduler": {"overlap": "on"}},
        "tree S5 k4 N8": {"scheduler": {"overlap": "on"}},
        "v1 tree": {"scheduler": {"overlap": "off"}},
    }
    both = "on (plain, tree S5 k4 N8) / off (v1 tree)"
    assert resolved_value(engines, "scheduler", "overlap") == both
    assert resolved_value({"plain": engines["plain"]}, "scheduler", "overlap") == "on"


def test_the_adaptive_policy_is_measured_beside_the_fixed_shapes_at_each_temperature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the head's report: the rank profiles its bands start from
    _, draft = ensure_preset_checkpoint("tiny", "eagle", tmp_path / "checkpoint")
    priors = {"greedy": [[0.75, 0.125], [0.625, 0.125]], "sampled": [[0.5, 0.25], [0.375, 0.25]]}
    (draft / "training.json").write_text(json.dumps({"rank_profile": priors}))
    argv = tiny_run(
        tmp_path, "--configs", "chain:S2", "tree:S2,k2,N3", "--batch-sizes", "1", "2",
        "--policy", "adaptive", "--temperatures", "0", "1", "--out", str(tmp_path / "run"),
        "--min-requests", "2",  # two windows a bs-1 row
    )  # fmt: skip
    status, out, _ = bench(argv, capsys)
    assert status == 0
    data = json.loads((tmp_path / "run.json").read_text())
    assert "sampled drafts drawn" in data["title"]  # the EAGLE head draws its drafts at T 1
    rows = data["rows"]
    cells = {(r["config"], r["batch_size"], r["temperature"]) for r in rows}
    configs = ("plain", "chain S2", TREE, "adaptive")
    # what the adaptive engine measured and learned: every candidate's step at every bucket,
    # greedy and sampled, and a rank profile for each temperature it ran
    (learned,) = data["adaptive"].values()
    assert learned["head_priors"] == priors  # what a replay of the run starts from
    costs = learned["step_costs"]
    # and its catch-up, a plain step's that extends the draft over the lag
    assert {(c["bucket"], c["sampled"]) for c in learned["catch_ups"]} == {
        (c["bucket"], c["sampled"]) for c in costs if c["shape"] == "plain"
    }
    assert all(c["measured_ms"] > 0 and c["every"] > 1 for c in learned["catch_ups"])
    assert {(c["shape"], c["sampled"]) for c in costs} == {
        (shape, sampled) for shape in ("plain", "chain S2", TREE) for sampled in (False, True)
    }
    assert all(c["measured_ms"] > 0 and c["learned_ms"] > 0 for c in costs)
    assert any(c["learned_ms"] != c["measured_ms"] for c in costs)  # the steps that ran

    # (which temperatures it drafted at is the policy's choice: on a loaded CPU a tiny random
    # pair's drafting steps may cost more than they commit, and greedy requests run plain);
    # a sampling band draws its drafts, and is learned apart from top-k drafts as "<band> drawn"
    drafted = {
        "greedy" if row["temperature"] == 0.0 else "T>0.85 drawn"
        for row in rows
        if row["config"] == "adaptive" and set(row["shape_steps"]) - {"plain"}
    }
    assert drafted <= set(learned["rank_profiles"]) <= {"greedy", "T>0.85 drawn"}
    # with each band's chain: a probability per depth of its profile
    for band, line in learned["line_rates"].items():
        assert len(line) == len(learned["rank_profiles"][band])
        assert all(0.0 <= rate <= 1.0 for rate in line)
    assert cells == {(c, bs, t) for c in configs for bs in (1, 2) for t in (0.0, 1.0)}
    for row in rows:
        # every timed step's committed tokens, together the window's
        assert len(row["step_tokens"]) == row["num_steps"]
        assert sum(row["step_tokens"]) == row["num_tokens"]
        if row["config"] == "adaptive":
            assert row["chosen"] in ("plain", "chain S2", TREE)
            # every step of the window counted by the shape it ran, the most run first
            steps = row["shape_steps"]
            assert next(iter(steps)) == row["chosen"]
            assert sum(steps.values()) >= row["num_steps"]  # (the warm-up steps counted too)
            # and which one each timed step launched, as many as its timed steps
            assert len(row["step_shapes"]) == len(row["step_ms"]) == row["num_steps"]
            # (a plain step that caught the draft up named apart)
            assert set(row["step_shapes"]) <= set(steps) | {CATCH_UP}
            # what its policy priced after each window, the last one the row's view
            views = row["policy_windows"]
            assert len(views) == (2 if row["batch_size"] == 1 else 1)
            assert views[-1] == row["policy_view"]
            # every candidate priced in each (those it ran among them)
            assert all(set(view) == set(row["policy_view"]) >= set(steps) for view in views)
            for priced in row["policy_view"].values():
                assert priced["model_tokens_per_step"] >= 1.0 and priced["ms"] > 0
        else:
            assert row["shape_steps"] == {} and row["step_shapes"] == []
            assert row["policy_windows"] == [] and row["policy_view"] == {}
        if row["config"] != "plain":  # against the plain row of the same bs and temperature
            plain = next(
                r for r in rows
                if (r["config"], r["batch_size"], r["temperature"])
                == ("plain", row["batch_size"], row["temperature"])
            )  # fmt: skip
            assert row["speedup"] == pytest.approx(row["tokens_per_s"] / plain["tokens_per_s"])
    assert "| config | bs | T | tok/s | ÷ plain |" in out
    assert "| adaptive (mostly " in out
    # and against the fixed engines, cell by cell, in the printed report and the written one
    assert "The adaptive policy against the fixed configurations of each cell:" in out
    for temperature in ("0", "1"):
        for bs in (1, 2):
            assert f"\n| {temperature} | {bs} | " in out
    assert "Geometric mean over the 4 cells of tok/s" in out
    assert out.count("Geometric mean") == 1
    assert "Geometric mean over the 4 cells" in (tmp_path / "run.md").read_text()


def test_prompts_cut_from_documents_are_measured_and_each_engine_times_its_first_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = ensure_preset_checkpoint("tiny", "eagle", tmp_path / "checkpoint")
    vocab_size = ConfigReader.from_dir(target).get_int("vocab_size")
    write_byte_level_tokenizer(target, vocab_size)  # the preset has none: --prompts needs one
    words = ["def", "return", "tree", "draft", "verify", "accept", "model", "token", "step"]
    texts = [" ".join(words[i:] + words[:i]) for i in range(3)]
    held, notes = tmp_path / "held.jsonl", tmp_path / "notes.txt"
    held.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    notes.write_text(" ".join(reversed(words)))
    argv = [
        "--target", str(target), "--draft-dir", str(draft), "--device", "cpu",
        "--attention", "torch", "--kv-move", "torch", "--prompt-len", "8", "--new-tokens", "4",
        "--warmup-steps", "1", "--profile-steps", "0", "--configs", "tree:S2,k2,N3",
        "--batch-sizes", "2", "--prompts", str(held), str(notes), "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    status, out, err = bench(argv, capsys)
    assert status == 0, err
    assert f"--prompts {held} {notes}: 4 documents" in err
    data = json.loads((tmp_path / "run.json").read_text())
    assert f"prompts from {held} {notes}, prompt 8" in data["title"]
    assert data["settings"]["argv"]["prompts"] == [str(held), str(notes)]
    assert [(r["config"], r["batch_size"]) for r in data["rows"]] == [("plain", 2), (TREE, 2)]
    assert all(r["worst_over_median"] >= 1.0 for r in data["rows"])
    first = data["first_requests"]
    assert [f["config"] for f in first] == ["plain", TREE]
    for f in first:
        assert f["cold_ms"] > 0 and f["warm_ms"] > 0
        assert f["cold_over_warm"] == pytest.approx(f["cold_ms"] / f["warm_ms"])
    assert "| config | cold ms | warm ms | cold ÷ warm |" in out
    assert "| ms/step | worst ÷ median step |" in out


def test_an_engine_that_does_not_fit_beside_the_others_names_interleave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagletree.app.bench import runs

    build = runs._build
    built: list[object] = []

    def second_runs_out(*args: Any) -> Any:
        if built:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        built.append(None)
        return build(*args)

    monkeypatch.setattr(runs, "_build", second_runs_out)
    argv = tiny_run(tmp_path, "--configs", "chain:S2", "--batch-sizes", "1", "--interleave")
    status, out, err = bench(argv, capsys)
    assert status == 1 and out == ""
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "--interleave holds every engine at once, and chain S2's does not fit beside" in line
    assert "beside the 1 built before it" in line
    assert "Tried to allocate 2.00 GiB)" in line and "run without --interleave" in line
