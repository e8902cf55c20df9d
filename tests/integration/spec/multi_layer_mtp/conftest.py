"""The multi-layer MTP tests' checkpoints, loaded once per package, on one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from eagletree.adapters.models.random_checkpoint_config import sizes_with
from tests.integration.spec.harness import SIZES, SpecModels, load_spec_models
from tests.integration.spec.multi_layer_mtp.engines import NUM_LAYERS, ModelCache


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny matrices: one thread is ~50x faster than two on a shared two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def mtp_models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[tuple[str, str], SpecModels] = {}

    def get(arch: str, device: torch.device | str = "cpu") -> SpecModels:
        key = (arch, str(device))
        if key not in cache:
            sizes = sizes_with(SIZES, num_mtp_layers=NUM_LAYERS[arch])
            root = tmp_path_factory.mktemp(f"{arch}-mtp")
            cache[key] = load_spec_models(root, arch, "mtp", torch.device(device), sizes=sizes)  # type: ignore[arg-type]
        return cache[key]

    return get
