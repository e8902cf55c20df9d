"""skinny_gemm (the weight-stream GEMM of decode steps) against ``F.linear`` (tolerances.py).

The reference multiplies the same rounded inputs in fp32 and rounds the result once, which is
what the kernel computes up to the order of its fp32 sum.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagletree.adapters.kernels.triton.skinny_gemm import MAX_ROWS, SkinnyConfig, skinny_gemm
from eagletree.adapters.models.tensor_parallel import RowParallelLinear
from tests.conftest import requires_cuda, requires_triton
from tests.unit.kernels.tolerances import assert_computed_close

# ragged against every tile: 100 columns over 32-column blocks, 300 deep over 128-deep steps
COLS, DEPTH = 100, 300
SMALL_TILE = SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2)


def operands(
    rows: int, width: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    weight = torch.randn(COLS, DEPTH, generator=generator) / DEPTH**0.5
    bias = torch.randn(COLS, generator=generator)
    return x.to(device, dtype), weight.to(device, dtype), bias.to(device, dtype)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 16, 17, MAX_ROWS, 0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_gemm_equals_the_linear_layer(
    device: torch.device, dtype: torch.dtype, rows: int, with_bias: bool
) -> None:
    requires_triton(device)
    x, weight, bias = operands(rows, DEPTH, dtype, device, seed=rows)
    b = bias if with_bias else None
    out = skinny_gemm(x, weight, b, config=SMALL_TILE)
    assert_computed_close(out, reference(x, weight, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 17, MAX_ROWS])
def test_a_residual_is_added_to_the_sum_before_its_one_rounding(
    device: torch.device, dtype: torch.dtype, rows: int
) -> None:
    requires_triton(device)
    x, weight, bias = operands(rows, DEPTH, dtype, device, seed=rows + 7)
    residual = (10 * torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows))).to(
        device, dtype
    )
    out = skinny_gemm(x, weight, bias, config=SMALL_TILE, residual=residual)
    summed = F.linear(x.float(), weight.float(), bias.float()) + residual.float()
    assert_computed_close(out, summed.to(dtype), scale=float(summed.abs().max()))
    with pytest.raises(ValueError, match="the residual must be"):
        skinny_gemm(x, weight, residual=residual[:, :-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 17, MAX_ROWS])
def test_the_result_is_also_stored_into_the_columns_of_a_wider_tensor(
    device: torch.device, dtype: torch.dtype, rows: int
) -> None:
    requires_triton(device)
    x, weight, bias = operands(rows, DEPTH, dtype, device, seed=rows + 11)
    residual = torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows)).to(
        device, dtype
    )
    # the middle third of a (rows, 3·COLS) tensor, as EAGLE-3's capture: row stride 3·COLS
    wide = torch.full((rows, 3 * COLS), 7.0, dtype=dtype, device=device)
    copy_to = wide[:, COLS : 2 * COLS]
    out = skinny_gemm(x, weight, bias, config=SMALL_TILE, residual=residual, copy_to=copy_to)
    summed = F.linear(x.float(), weight.float(), bias.float()) + residual.float()
    assert_computed_close(out, summed.to(dtype), scale=float(summed.abs().max()))
    assert torch.equal(copy_to, out)  # the same rounded values, stored twice
    assert bool((wide[:, :COLS] == 7.0).all()) and bool((wide[:, 2 * COLS :] == 7.0).all())
    with pytest.raises(ValueError, match="copy_to must be"):
        skinny_gemm(x, weight, copy_to=wide[:, : COLS - 1])


def test_row_parallel_layers_stream_only_a_decode_steps_rows(device: torch.device) -> None:
    requires_triton(device)
    down = RowParallelLinear(DEPTH, COLS, bias=True, fused_kernels=True).to(device)
    few, _, _ = operands(3, DEPTH, torch.float32, device, seed=1)
    many, _, _ = operands(MAX_ROWS + 1, DEPTH, torch.float32, device, seed=2)
    assert down.streams(few) and not down.streams(many)
    assert not RowParallelLinear(DEPTH, COLS, bias=True).to(device).streams(few)
    with torch.no_grad():
        for x in (few, many):
            assert_computed_close(down(x), reference(x, down.weight, down.bias))


def test_inputs_it_cannot_stream_are_refused() -> None:
    weight = torch.zeros(8, 16)
    with pytest.raises(ValueError, match="rows ≤"):
        skinny_gemm(torch.zeros(MAX_ROWS + 1, 16), weight)
    with pytest.raises(ValueError, match="weight \\(N, K\\)"):
        skinny_gemm(torch.zeros(2, 15), weight)
    with pytest.raises(ValueError, match="unit column stride"):
        skinny_gemm(torch.zeros(16, 2).t(), weight)


SUM_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2**-6}
LLAMA_8B = [(4096, 4096), (14336, 4096), (4096, 128256)]  # o_proj, down_proj, lm_head (K, N)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("depth", "cols"), LLAMA_8B)
def test_the_default_tiles_fit_the_gpu_at_every_row_count_of_a_decode_bucket(
    depth: int, cols: int, dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(cols)
    weight = (torch.randn(cols, depth, generator=generator) / depth**0.5).to("cuda", dtype)
    for rows in (1, 2, 4, 8, 16, 24, 32, 48, 64):
        x = torch.randn(rows, depth, generator=generator).to("cuda", dtype)
        error = (skinny_gemm(x, weight).float() - reference(x, weight, None).float()).abs()
        # a K-long sum in another order: its error is relative to the sum of the products'
        # magnitudes (an output near zero keeps it), plus the output's rounding
        magnitude = F.linear(x.float().abs(), weight.float().abs())
        assert (error <= SUM_TOLERANCE[dtype] * magnitude).all()
