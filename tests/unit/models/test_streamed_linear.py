"""Linear layers on the weight-stream kernel, and FP8 draft weights against their widened copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagletree.adapters.kernels.triton.skinny_gemm import FP8_MAX_ROWS, MAX_ROWS
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.streamed_linear import (
    FP8_DTYPE,
    FP8_MAX,
    PlainLinear,
    StreamedLinear,
    dequantize_rows,
    quantize_fp8,
    quantize_rows,
)
from eagletree.adapters.models.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from tests.conftest import requires_triton


@pytest.mark.parametrize("seed", range(4))
def test_quantized_rows_round_to_e4m3_relative_to_each_rows_largest_magnitude(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    magnitudes = torch.logspace(-3, 3, 24)[:, None]  # rows of very different sizes
    weight = torch.randn(24, 200, generator=generator) * magnitudes
    weight[5] = 0.0
    quantized, scale = quantize_rows(weight)
    assert quantized.dtype == FP8_DTYPE and scale.dtype == torch.float32
    assert scale[5] == 1.0  # an all-zero row
    widened = dequantize_rows(quantized, scale, torch.float32)
    # each row's largest entry maps to FP8_MAX; 3 mantissa bits: half an ulp is 2^-4 relative,
    # and below e4m3's smallest normal (2^-6) its spacing 2^-9 is absolute, in units of scale
    nonzero = scale != 1.0
    torch.testing.assert_close(
        widened.abs().amax(dim=1)[nonzero], weight.abs().amax(dim=1)[nonzero], rtol=1e-6, atol=0
    )
    bound = 2**-4 * weight.abs() + 2**-10 * scale[:, None]
    assert ((widened - weight).abs() <= bound * (1 + 1e-6)).all()
    assert (quantized.float().abs().amax(dim=1)[nonzero] == FP8_MAX).all()  # the whole range


def _layers() -> list[StreamedLinear]:
    return [
        ColumnParallelLinear(48, 40, bias=True, fused_kernels=True),
        RowParallelLinear(48, 40, bias=False, fused_kernels=True),
        MergedLinear(48, [("q", 24), ("k", 16)], bias=False),
        PlainLinear(48, 40, bias=True),
    ]


@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("rows", [1, 5, MAX_ROWS + 3])
def test_an_fp8_layer_on_the_kernel_equals_its_widened_weight_on_torch(
    index: int, rows: int
) -> None:
    requires_triton("cpu")
    torch.manual_seed(index)
    layer = _layers()[index]
    x = torch.randn(rows, 48)
    with torch.no_grad():
        layer.quantize_fp8(fused_kernels=True)
        assert layer.streams(x)  # FP8 takes the kernel at every class, up to FP8_MAX_ROWS rows
        streamed = layer(x)
        layer.fused_kernels = False  # the torch path: a widened copy of the weight
        assert not layer.streams(x)
        widened = layer(x)
    assert layer.weight.dtype == FP8_DTYPE and not layer.weight.requires_grad
    torch.testing.assert_close(streamed, widened, rtol=1e-5, atol=1e-5)


def test_only_fp8_weights_stream_through_a_plain_layer_and_only_within_their_row_limit() -> None:
    merged = MergedLinear(48, [("gate", 32), ("up", 32)], bias=False)
    merged.fused_kernels = True
    row = RowParallelLinear(48, 40, bias=False, fused_kernels=True)
    assert not merged.streams_rows(1) and row.streams_rows(MAX_ROWS)
    assert not row.streams_rows(MAX_ROWS + 1)
    for layer in (merged, row):
        layer.quantize_fp8(fused_kernels=True)
        assert layer.streams_rows(FP8_MAX_ROWS) and not layer.streams_rows(FP8_MAX_ROWS + 1)


def test_every_linear_layer_of_a_module_becomes_fp8_and_nothing_else_changes() -> None:
    head = nn.Sequential(
        PlainLinear(16, 8, bias=False), nn.LayerNorm(8), RowParallelLinear(8, 8, bias=False)
    )
    assert quantize_fp8(head, fused_kernels=False) == 2
    assert head[0].weight.dtype == FP8_DTYPE and head[2].weight.dtype == FP8_DTYPE
    assert head[1].weight.dtype == torch.float32
