"""The overlap tests' checkpoints, loaded once per package."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import ModelSizes
from tests.integration.spec.harness import SIZES, SpecModels, load_spec_models
from tests.integration.spec.overlap.runs import ModelCache


@pytest.fixture(scope="package")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[str, str, str, str], SpecModels] = {}

    def get(arch: str, kind: str, sizes: ModelSizes = SIZES, device: str = "cpu") -> SpecModels:
        key = (arch, kind, repr(sizes), device)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, torch.device(device), sizes=sizes)  # type: ignore[arg-type]
        return cache[key]

    return get
