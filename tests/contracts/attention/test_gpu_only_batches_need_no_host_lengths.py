"""GPU-only batches (no host copies of the lengths): every backend matches the
reference without them, and on CUDA never synchronises with the host."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.batch import ForwardMode
from eagletree.domain.tree import TreeMaskMode
from tests.conftest import requires_cuda
from tests.contracts.attention.backends import (
    BACKENDS,
    CHECKED_BACKENDS,
    MODES,
    TOLERANCE,
    backend_factory,
    random_case,
    random_twins,
    run,
)
from tests.contracts.attention.cases import Shape


@pytest.mark.parametrize("backend", CHECKED_BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_gpu_only_batch_without_host_lengths_matches_the_reference(
    backend: str, mode: ForwardMode, device: torch.device
) -> None:
    factory = backend_factory(backend, device)
    dtype = torch.float16
    for shape in (Shape(8, 2, 64, 64), Shape.mla(4, 32, 16)):
        case, expected = random_twins(mode, shape, device, dtype, 61, bs=4, gpu_only=True)
        assert case.batch.seq_lens_sum is None and case.batch.extend_lens_cpu is None
        atol, rtol = TOLERANCE[dtype]
        torch.testing.assert_close(run(factory(case), case).float(), expected, atol=atol, rtol=rtol)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_gpu_only_batch_never_synchronises_with_the_host(backend: str, mode: ForwardMode) -> None:
    device = torch.device("cuda")
    factory = backend_factory(backend, device)
    for shape in (Shape(8, 2, 64, 64), Shape.mla(8, 32, 16)):
        case = random_case(
            mode,
            shape,
            device,
            torch.bfloat16,
            51,
            bs=4,
            gpu_only=True,
            mask_mode=TreeMaskMode.QLEN_ONLY,
        )
        assert case.batch.seq_lens_sum is None and case.batch.seq_lens_cpu is None
        impl = factory(case)
        expected = run(impl, case)  # compiles the kernels outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = run(impl, case)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(out, expected, atol=0, rtol=0)
