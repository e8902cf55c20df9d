"""`eagletree generate`: the embedded default checkpoint, token ids and text in, tokens out."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from eagletree.app.cli import generate as generate_cli
from eagletree.app.composition.default_checkpoint import (
    default_checkpoint_dir,
    ensure_default_checkpoint,
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="eagletree")
    generate_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["generate", *argv])


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = generate_cli.run(parse(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture
def cpu_defaults(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user cache in a temporary directory and settings that run on the CPU."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    monkeypatch.setenv("EAGLETREE_MODEL__DTYPE", "float32")
    monkeypatch.setenv("EAGLETREE_BACKEND__ATTENTION", "torch")
    monkeypatch.setenv("EAGLETREE_BACKEND__KV_MOVE", "torch")
    monkeypatch.setenv("EAGLETREE_MEMORY__MAX_TOTAL_TOKENS", "2048")
    return cache_home


def test_the_default_checkpoint_is_created_once_in_the_user_cache(tmp_path: Path) -> None:
    messages: list[str] = []
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    target = ensure_default_checkpoint(notify=messages.append, environ=environ)
    assert target.parent == default_checkpoint_dir(environ)
    assert target.is_relative_to(tmp_path / "eagletree")
    assert (target / "config.json").is_file() and (target.parent / "draft").is_dir()
    assert len(messages) == 1 and str(target.parent) in messages[0]
    assert ensure_default_checkpoint(notify=messages.append, environ=environ) == target
    assert len(messages) == 1
    assert [p.name for p in tmp_path.joinpath("eagletree").iterdir()] == [target.parent.name]


def test_cache_dir_falls_back_to_dot_cache_in_the_home_directory() -> None:
    assert default_checkpoint_dir({}).parent == Path.home() / ".cache" / "eagletree"


def test_generate_prints_one_line_of_ids_per_prompt_and_a_throughput_summary(
    cpu_defaults: Path,
) -> None:
    status, out, err = run(
        ["--prompt-ids", "1 2 3", "--prompt-ids", "4,5", "--max-new-tokens", "6"]
    )
    assert status == 0, err
    lines = out.splitlines()  # ids then text (the default checkpoint has a tokenizer)
    assert [line.split(" ", 1)[0] for line in lines] == ["[0]", "[0]", "[1]", "[1]"]
    for line in lines[::2]:
        ids = line.split(" ", 1)[1].rsplit("  ", 1)[0].split()
        assert 1 <= len(ids) <= 6 and all(token.isdigit() for token in ids)
    assert all(line.split(" ", 2)[1] == "text:" for line in lines[1::2])
    assert "tok/s" in err and "generated" in err
    assert "[0] " in err and "first token" in err  # per-request timings


def test_greedy_generate_is_deterministic_and_matches_the_engine(cpu_defaults: Path) -> None:
    first = run(["--prompt-ids", "7 8 9", "--max-new-tokens", "5", "--no-progress"])
    second = run(["--prompt-ids", "7 8 9", "--max-new-tokens", "5", "--no-progress"])
    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    assert not [line for line in first[2].splitlines() if line.startswith("step ")]  # no progress


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a CPU-only machine")
def test_without_a_settings_file_or_cuda_generate_falls_back_to_the_cpu(
    cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setenv("EAGLETREE_MEMORY__MAX_TOTAL_TOKENS", "2048")
    status, out, err = run(["--max-new-tokens", "2"])
    assert status == 0, err
    assert "no CUDA device: running on the CPU" in err
    assert "no prompt given: using the prompt 'The draft tree'" in err
    assert out.startswith("[0] ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompt-ids", "1 two 3"], "token id 'two'"),
        (["--prompt-ids", "1 99999"], "request 0: token id 99999"),
        (["--chat", "--prompt-ids", "1"], "--chat applies to --prompt TEXT"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    ],
)
def test_bad_input_exits_1_with_the_reason_on_stderr(
    cpu_defaults: Path, argv: list[str], message: str
) -> None:
    status, out, err = run(argv)
    assert status == 1
    assert message in err
    assert out == ""


def test_text_prompts_are_encoded_and_outputs_decoded_with_the_checkpoints_tokenizer(
    cpu_defaults: Path, tmp_path: Path
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    source = ensure_default_checkpoint(notify=lambda _: None)
    checkpoint = tmp_path / "with-tokenizer"
    shutil.copytree(source, checkpoint)
    words = {f"w{i}": i for i in range(512)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'[model]\ntarget_path = "{checkpoint}"\ndevice = "cpu"\ndtype = "float32"\n'
        '[backend]\nattention = "torch"\nkv_move = "torch"\n'
    )
    status, out, err = run(
        ["--settings", str(settings), "--prompt", "w5 w6 w7", "--max-new-tokens", "4"]
    )
    assert status == 0, err
    ids_line, text_line = out.splitlines()
    ids = [int(t) for t in ids_line.split(" ", 1)[1].rsplit("  ", 1)[0].split()]
    assert text_line == f"[0] text: {json.dumps(tokenizer.decode(ids))}"


def test_the_embedded_default_speculates_with_its_eagle_head_and_matches_plain_greedy(
    cpu_defaults: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--prompt-ids", "3 1 4 1 5", "--max-new-tokens", "12", "--no-progress"]
    status, speculative_out, err = run(argv)
    assert status == 0, err
    assert "embedded default: EAGLE tree speculation" in err
    assert "speculation: mean acceptance length" in err
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__ALGORITHM", "none")
    status, plain_out, err = run(argv)
    assert status == 0, err
    assert "speculation:" not in err
    assert speculative_out == plain_out  # greedy speculation is lossless


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("example", "arch", "draft", "out"),
    [
        ("tiny-tree.toml", "llama", "eagle", "tiny-llama-eagle"),
        ("tiny-tree.yaml", "llama", "eagle", "tiny-llama-eagle"),
        ("chain.toml", "llama", "eagle3", "tiny-llama-eagle3"),
        ("mtp.toml", "deepseek-mla", "mtp", "tiny-deepseek-mtp"),
        ("paged-v1.toml", "llama", "eagle", "tiny-llama-eagle"),
    ],
)
def test_every_example_generates_on_the_checkpoints_its_comment_says_to_write(
    example: str,
    arch: str,
    draft: str,
    out: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu_defaults: Path,
) -> None:
    from eagletree.app.cli import init_random as init_random_cli

    assert f"--draft {draft} --out checkpoints/{out}" in (EXAMPLES / example).read_text()
    # the examples name checkpoints relative to the file: ../checkpoints from examples/
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser(prog="eagletree")
    init_random_cli.add_parser(parser.add_subparsers(dest="command"))
    argv = ["init-random", "--arch", arch, "--draft", draft, "--out", f"checkpoints/{out}"]
    assert init_random_cli.run(parser.parse_args(argv)) == 0
    status, stdout, err = run(
        ["--settings", str(tmp_path / "examples" / example), "--prompt-ids", "1 2 3",
         "--max-new-tokens", "6",
         "--no-progress"]
    )  # fmt: skip
    assert status == 0, err
    assert stdout.startswith("[0] ")
    assert "speculation: mean acceptance length" in err


def test_text_prompts_stream_as_they_are_generated_and_equal_the_batch_output(
    cpu_defaults: Path,
) -> None:
    argv = ["--prompt", "The draft tree", "--max-new-tokens", "10", "--no-progress"]
    status, batch_out, err = run(argv)
    assert status == 0, err
    text_line = batch_out.splitlines()[1]
    assert text_line.startswith("[0] text: ")
    status, streamed, err = run([*argv, "--stream"])
    assert status == 0, err
    assert streamed == json.loads(text_line.removeprefix("[0] text: ")) + "\n"


def test_json_output_has_one_object_per_prompt_with_text_and_timings(cpu_defaults: Path) -> None:
    status, out, err = run(
        ["--prompt", "a b", "--prompt", "tree", "--max-new-tokens", "4", "--json", "--no-progress"]
    )
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["index"] for row in rows] == [0, 1]
    for row in rows:
        assert 1 <= len(row["output_ids"]) <= 4 and isinstance(row["text"], str)
        assert row["prompt_ids"][0] == 1  # BOS
        assert row["timings"]["latency_s"] >= row["timings"]["time_to_first_token_s"] >= 0
        assert row["acceptance"]["histogram"]  # the default speculates


def test_a_prompts_file_mixes_text_ids_and_chat_messages(
    cpu_defaults: Path, tmp_path: Path
) -> None:
    file = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "The draft tree"},
        {"prompt_ids": [1, 5, 9]},
        {"messages": [{"role": "user", "content": "hello"}]},
    ]
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    status, out, err = run(
        ["--prompts-file", str(file), "--max-new-tokens", "3", "--json", "--no-progress"]
    )
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[1]["prompt_ids"] == [1, 5, 9]
    status, chat_out, err = run(
        ["--prompt", "hello", "--chat", "--max-new-tokens", "3", "--json", "--no-progress"]
    )
    assert status == 0, err
    assert json.loads(chat_out)["prompt_ids"] == rows[2]["prompt_ids"]  # the chat template
    assert len(rows[2]["prompt_ids"]) > len(rows[0]["prompt_ids"])


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from eagletree import __version__
    from eagletree.app.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"eagletree {__version__}"


def test_a_default_run_is_quiet_and_names_the_default_prompts_ids_only_without_a_tokenizer(
    cpu_defaults: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from eagletree.app.cli.main import main

    status, _, err = run(["--max-new-tokens", "2", "--no-progress"])  # its tokenizer: text
    assert status == 0, err
    logged = capfd.readouterr().err  # what logging's last resort prints
    assert "no prompt given: using the prompt 'The draft tree'\n" in err
    assert "ids" not in err.split("no prompt given")[1].splitlines()[0]
    assert "max_running_requests" not in err + logged and "warning" not in logged.lower()
    assert main(["init-random", "--arch", "llama", "--out", str(tmp_path)]) == 0
    settings = tmp_path / "s.toml"
    settings.write_text('[model]\ntarget_path = "target"\n')
    status, _, err = run(["--settings", str(settings), "--max-new-tokens", "2", "--no-progress"])
    assert status == 0, err
    assert "the checkpoint has no tokenizer: the default prompt is the ids 1 2 3 4" in err
