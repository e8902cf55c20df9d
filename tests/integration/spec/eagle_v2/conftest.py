"""The v2 tests' tiny random checkpoints, loaded once per package."""

from __future__ import annotations

import pytest
import torch

from tests.integration.spec.eagle_v2.engines import ModelCache
from tests.integration.spec.harness import SpecModels, load_spec_models


@pytest.fixture(scope="package")
def spec_models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    """Loads each (arch, draft, device, sizes) once per module."""
    cache: dict[tuple[object, ...], SpecModels] = {}

    def get(arch: str, kind: str, device: torch.device, **options: object) -> SpecModels:
        key = (arch, kind, str(device), tuple(sorted(options.items())))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, device, **options)  # type: ignore[arg-type]
        return cache[key]

    return get
