"""`eagletree config validate` through the entry point: every example and the
defaults pass, missing checkpoints, typos, contradictions and missing files fail with
exit status 1."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eagletree.app.cli.main import main
from tests.integration.cli.commands import EXAMPLES, show


def test_validate_accepts_every_example_once_its_checkpoints_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLES, examples)
    for arch, draft, out in (
        ("llama", "eagle", "tiny-llama-eagle"),
        ("llama", "eagle3", "tiny-llama-eagle3"),
        ("deepseek-mla", "mtp", "tiny-deepseek-mtp"),
    ):
        argv = ["init-random", "--arch", arch, "--draft", draft]
        assert main([*argv, "--out", str(tmp_path / "checkpoints" / out)]) == 0
    capsys.readouterr()
    for path in sorted(examples.glob("*.[ty]*ml")):
        assert main(["config", "validate", str(path)]) == 0, (path, capsys.readouterr().err)
        assert capsys.readouterr().out == "ok\n"


def test_validate_accepts_the_defaults_before_and_after_the_default_checkpoint_exists(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from eagletree.app.composition.default_checkpoint import ensure_default_checkpoint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["config", "validate"]) == 0  # generate writes it on first use
    ensure_default_checkpoint(notify=lambda _: None)
    assert main(["config", "validate"]) == 0
    assert capsys.readouterr().out == "ok\nok\n"
    shown = show(capsys)
    assert shown["target"]["num_layers"] == 4  # now read from the checkpoint


def test_validate_rejects_an_example_whose_checkpoints_are_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shutil.copy(EXAMPLES / "tiny-tree.toml", tmp_path)
    assert main(["config", "validate", str(tmp_path / "tiny-tree.toml")]) == 1
    err = capsys.readouterr().err
    assert "model.target_path" in err and "is not a directory" in err


def test_validate_rejects_a_typo_with_exit_status_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[backend]\nkv_move = "cuda"\n')
    assert main(["config", "validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "backend.kv_move (EAGLETREE_BACKEND__KV_MOVE) = 'cuda': allowed values are" in (
        captured.err
    )


def test_validate_rejects_a_contradiction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "v2-paged.toml"
    text = (EXAMPLES / "paged-v1.toml").read_text().replace('version = "auto"', 'version = "v2"')
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 1
    assert "speculative.version = 'v2' cannot run this configuration" in capsys.readouterr().err


def test_validate_rejects_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "validate", str(tmp_path / "nope.toml")]) == 1
    assert "does not exist" in capsys.readouterr().err
