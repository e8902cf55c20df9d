"""The composition-root tests run without EAGLETREE_* variables, on the CPU and
(where present) CUDA given by name."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("EAGLETREE_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=["cpu", "cuda"])
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return str(request.param)
