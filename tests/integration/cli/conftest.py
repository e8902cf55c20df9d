"""The command-line tests run without EAGLETREE_* variables."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("EAGLETREE_"):
            monkeypatch.delenv(name)
