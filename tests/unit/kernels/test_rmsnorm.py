"""rmsnorm and fused_add_rmsnorm against the torch RMSNorm of the models (tolerances.py)."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.models.layers import RMSNorm, rms_norm
from tests.conftest import requires_triton
from tests.unit.kernels.tolerances import assert_computed_close, assert_rounded_sum_equal

DTYPES = (torch.float32, torch.bfloat16)


def reference_norm(
    hidden: int, dtype: torch.dtype, device: torch.device, fused: bool = False
) -> RMSNorm:
    norm = rms_norm(hidden, eps=1e-5, fused_kernels=fused)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(1)))
    return norm.to(device=device, dtype=dtype)


def rows(num_tokens: int, hidden: int, seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(num_tokens, hidden, generator=generator)).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [13, 0])
def test_rmsnorm_equals_the_torch_reference(
    device: torch.device, dtype: torch.dtype, num_tokens: int
) -> None:
    requires_triton(device)
    norm = reference_norm(80, dtype, device)
    # a strided view, as the MLA latent (columns 0..80 of 96)
    x = rows(num_tokens, 96, seed=2, device=device).to(dtype)[:, :80]
    out = rmsnorm(x, norm.weight, norm.eps)
    assert_computed_close(out, norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [13, 0])
def test_fused_add_rmsnorm_updates_the_residual_in_place_and_normalises_the_sum(
    device: torch.device, dtype: torch.dtype, num_tokens: int
) -> None:
    requires_triton(device)
    norm = reference_norm(80, dtype, device)
    x = rows(num_tokens, 80, seed=3, device=device).to(dtype)
    residual = rows(num_tokens, 80, seed=4, device=device).to(dtype)
    expected_sum = residual + x
    out, summed = fused_add_rmsnorm(x, residual, norm.weight, norm.eps)
    assert summed is residual
    assert_rounded_sum_equal(residual, expected_sum)
    assert_computed_close(out, norm(residual))  # the norm of the sum it wrote


def test_fused_add_rmsnorm_can_leave_the_residual_untouched(device: torch.device) -> None:
    requires_triton(device)
    norm = reference_norm(80, torch.float32, device)
    x, residual = rows(13, 80, 5, device), rows(13, 80, 6, device)
    before = residual.clone()
    target = torch.empty_like(residual)
    out, summed = fused_add_rmsnorm(x, residual, norm.weight, norm.eps, target)
    assert summed is target and torch.equal(residual, before)
    assert torch.equal(summed, before + x)
    assert_computed_close(out, norm(before + x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rmsnorm_also_stores_the_sum_into_the_columns_of_a_wider_tensor(
    device: torch.device, dtype: torch.dtype
) -> None:
    requires_triton(device)
    norm = reference_norm(80, dtype, device)
    x = rows(13, 80, seed=9, device=device).to(dtype)
    residual = rows(13, 80, seed=10, device=device).to(dtype)
    expected_sum = residual + x
    # the last of three captures, as EAGLE-3's: row stride 240
    wide = torch.full((13, 240), 7.0, dtype=dtype, device=device)
    copy_to = wide[:, 160:]
    out, summed = fused_add_rmsnorm(x, residual, norm.weight, norm.eps, copy_to=copy_to)
    assert summed is residual
    assert_rounded_sum_equal(residual, expected_sum)
    assert torch.equal(copy_to, residual)  # the same rounded sum, stored twice
    assert bool((wide[:, :160] == 7.0).all())
    assert_computed_close(out, norm(residual))
    with pytest.raises(ValueError, match="copy_to"):
        fused_add_rmsnorm(x, residual, norm.weight, norm.eps, copy_to=wide[:, :79])
    # the module's reference path stores the same sum
    reference = reference_norm(80, dtype, device)
    kept = torch.empty_like(x)
    _, reference_sum = reference.add(x, expected_sum - x, copy_to=kept)
    assert torch.equal(kept, reference_sum)


def test_the_fused_rmsnorm_module_path_matches_its_reference_path(device: torch.device) -> None:
    requires_triton(device)
    reference = reference_norm(80, torch.float32, device)
    fused = reference_norm(80, torch.float32, device, fused=True)
    x, residual = rows(13, 80, 7, device), rows(13, 80, 8, device)
    assert_computed_close(fused(x), reference(x))
    out, summed = fused.add(x, residual.clone(), reuse_residual=False)
    ref_out, ref_sum = reference.add(x, residual)
    assert torch.equal(summed, ref_sum)
    assert_computed_close(out, ref_out)


def test_rmsnorm_writes_into_a_column_block_and_nothing_else(device: torch.device) -> None:
    requires_triton(device)
    norm = reference_norm(80, torch.float32, device)
    x = rows(13, 80, 9, device)
    buffer = torch.full((13, 112), 7.0, device=device)
    out = rmsnorm(x, norm.weight, norm.eps, buffer[:, 16:96])
    assert out.data_ptr() == buffer[:, 16:].data_ptr()
    assert_computed_close(buffer[:, 16:96], norm(x))
    assert torch.equal(buffer[:, :16], torch.full((13, 16), 7.0, device=device))
    assert torch.equal(buffer[:, 96:], torch.full((13, 16), 7.0, device=device))
