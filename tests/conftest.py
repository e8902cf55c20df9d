"""Shared test fixtures: the ``device`` fixture and the Triton skip rule.

Every test that takes ``device`` runs on CPU and, when one is present, on CUDA. Tests that
launch Triton kernels call ``requires_triton(device)`` first: on CPU they run only under the
interpreter (``TRITON_INTERPRET=1``, which must be set before Triton kernels are defined).
The hypothesis profiles are registered here (see ``tests/hypothesis_profiles.py``).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.hypothesis_profiles import load_profile_from_environment, register_profiles


@pytest.hookimpl(tryfirst=True)  # before hypothesis's own hook, so --hypothesis-profile wins
def pytest_configure(config: pytest.Config) -> None:
    register_profiles()
    load_profile_from_environment()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which the GPU machine may lack
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup``: single tests, but whole modules or folders where fixtures are
    costly (see ``tests/xdist_scheduling.py``)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_scheduling import CostlyFixtureScheduling

    return CostlyFixtureScheduling(config, log)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def triton_interpreted() -> bool:
    """Whether Triton kernels run in the CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def requires_triton(device: torch.device | str) -> None:
    """Skip the calling test when Triton cannot run on ``device`` (CPU without the interpreter)."""
    if torch.device(device).type == "cpu" and not triton_interpreted():
        pytest.skip("Triton on CPU needs TRITON_INTERPRET=1")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.gpu])])
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)
