"""The shipped examples and `eagletree config show` parsed, for the command-line
tests."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from eagletree.app.cli.main import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def show(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["config", "show", *args]) == 0
    return tomllib.loads(capsys.readouterr().out)
