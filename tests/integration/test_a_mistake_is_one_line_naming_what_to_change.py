"""Every user mistake of docs/errors.md ends in one line naming what to change, not a
traceback.

Each case (``tests/integration/errors/cases.py``) prepares files or variables, runs
the `eagletree` command line, and checks the exit status, that stderr holds exactly
one `error:` line (or the `warning:` line) with the expected words, and that no
traceback was printed. The ids are the rows of the tables in docs/errors.md, with
the server's bad requests (tests/integration/server/bad_requests.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from eagletree.app.cli.main import main
from tests.integration.errors.cases import CASES, WARNINGS
from tests.integration.errors.setups import Paths, env, generate, target_settings
from tests.integration.server.bad_requests import SERVER_CASES

SMALL = {"EAGLETREE_MEMORY__MAX_TOTAL_TOKENS": "1024"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("errors")
    assert main(["init-random", "--arch", "llama", "--draft", "eagle", "--out", str(root)]) == 0
    return root, tmp_path_factory.mktemp("errors-cache")


@pytest.fixture
def paths(shared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    env(monkeypatch, **SMALL)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared[1]))
    monkeypatch.chdir(tmp_path)
    return Paths(tmp_path, shared[0], shared[1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_is_one_line_naming_what_to_change(
    case: str, paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    setup, words = CASES[case]
    argv = setup(paths, monkeypatch)
    status = main(argv)
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1, err
    assert len(errors) == 1, err
    assert words in errors[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", sorted(WARNINGS))
def test_an_ignored_flag_is_a_warning(
    case: str, paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    setup, words = WARNINGS[case]
    status = main(setup(paths, monkeypatch))
    err = capfd.readouterr().err
    assert status == 0, err
    assert any(line.startswith("warning:") and words in line for line in err.splitlines()), err


def test_the_table_in_the_docs_lists_every_case() -> None:
    table = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if "| `" in line}
    assert set(CASES) | set(WARNINGS) | set(SERVER_CASES) == rows
    assert len(CASES) >= 40


def test_device_cpu_alone_runs_with_the_torch_backends(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as on a user's machine
    settings = target_settings(paths, paths.checkpoint / "target")
    assert main(generate(settings)) == 0, capfd.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_cuda_is_an_error_naming_the_setting(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cuda")
    assert main(["config", "validate"]) == 1
    assert "model.device = 'cuda' but no CUDA device is visible" in capfd.readouterr().err
