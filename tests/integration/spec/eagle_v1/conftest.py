"""The v1 tests' checkpoints, loaded once per package, on one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.integration.spec.eagle_v1.engines import ModelCache
from tests.integration.spec.harness import SpecModels, load_spec_models


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny matrices: one thread is ~50x faster than two on a shared two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def spec_models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[object, ...], SpecModels] = {}

    def get(arch: str, kind: str, device: torch.device) -> SpecModels:
        key = (arch, kind, str(device))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, device)  # type: ignore[arg-type]
        return cache[key]

    return get
