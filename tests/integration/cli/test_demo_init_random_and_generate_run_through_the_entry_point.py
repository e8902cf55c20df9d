"""The other `eagletree` commands through the entry point: usage errors, demo,
init-random (and its disk check), generate, and the TOML writer config show uses."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from eagletree.app.cli.main import main, to_toml


def test_a_missing_subcommand_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as raised:
        main(["config"])
    assert raised.value.code == 2


def test_demo_runs_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "one decode step" in capsys.readouterr().out


def test_the_toml_writer_round_trips_nested_tables() -> None:
    table = {
        "a": {"s": 'quote " and \\ and é', "n": 3, "f": 0.5, "b": True, "none": None},
        "b": {"list": ["x", "y"], "c": {"deep": 1}},
    }
    parsed = tomllib.loads(to_toml(table))
    expected = {
        "a": {"s": 'quote " and \\ and é', "n": 3, "f": 0.5, "b": True},
        "b": {"list": ["x", "y"], "c": {"deep": 1}},
    }
    assert parsed == expected


def test_demo_options_reach_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["demo", "--help"])
    assert raised.value.code == 0
    assert "one tree decode step on fixed numbers" in capsys.readouterr().out


def test_init_random_through_the_command_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    status = main(["init-random", "--arch", "llama", "--draft", "eagle", "--out", str(out)])
    assert status == 0
    assert (out / "target" / "config.json").is_file() or (out / "config.json").is_file()


def test_generate_through_the_command_prints_the_generated_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    monkeypatch.setenv("EAGLETREE_MODEL__DTYPE", "float32")
    monkeypatch.setenv("EAGLETREE_BACKEND__ATTENTION", "torch")
    monkeypatch.setenv("EAGLETREE_BACKEND__KV_MOVE", "torch")
    monkeypatch.setenv("EAGLETREE_MEMORY__MAX_TOTAL_TOKENS", "1024")
    status = main(["generate", "--prompt-ids", "5 6 7", "--max-new-tokens", "3", "--no-progress"])
    assert status == 0
    printed = capfd.readouterr().out.split()  # the command writes to the real stdout
    assert printed[0] == "[0]"
    assert len([token for token in printed if token.isdigit()]) == 3


def test_init_random_refuses_a_checkpoint_the_disk_of_out_cannot_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil as shutil_module
    from collections import namedtuple

    from eagletree.adapters.models.random_checkpoint_config import PRESETS
    from eagletree.app.cli.init_random import check_room
    from eagletree.domain.errors import ConfigurationError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(1, 1, 1000))
    with pytest.raises(ConfigurationError, match=r"takes [0-9.]+ MiB and .* has 0\.0 MiB free"):
        check_room("llama", "eagle", PRESETS["tiny"], torch.bfloat16, tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
