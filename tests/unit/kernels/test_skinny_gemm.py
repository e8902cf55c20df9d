"""skinny_gemm (the weight-stream GEMM of decode steps) against ``F.linear`` (tolerances.py).

The reference multiplies the same rounded inputs in fp32 and rounds the result once, which is
what the kernel computes up to the order of its fp32 sum; with ``silu_mul_input`` the input is
the torch SwiGLU activation ``silu(gate) * up`` in the activation dtype.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagletree.adapters.kernels.triton.skinny_gemm import (
    MAX_ROWS,
    SkinnyConfig,
    default_config,
    skinny_gemm,
)
from eagletree.adapters.models.tensor_parallel import RowParallelLinear
from tests.conftest import requires_cuda, requires_triton
from tests.unit.kernels.tolerances import assert_computed_close, rounded_like_torch

# ragged against every tile: 100 columns over 32-column blocks, 300 deep over 128-deep steps
COLS, DEPTH = 100, 300
SMALL_TILE = SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2)


def operands(
    rows: int, width: int, dtype: torch.device | torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    weight = torch.randn(COLS, DEPTH, generator=generator) / DEPTH**0.5
    bias = torch.randn(COLS, generator=generator)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, weight, bias))  # type: ignore[return-value]


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
@pytest.mark.parametrize("rows", [1, 9, 40])
def test_a_gate_up_input_is_multiplied_as_silu_of_gate_times_up(
    device: torch.device, dtype: torch.dtype, rows: int
) -> None:
    requires_triton(device)
    gate_up, weight, bias = operands(rows, 2 * DEPTH, dtype, device, seed=100 + rows)
    gate, up = gate_up.chunk(2, dim=-1)
    activation = F.silu(gate) * up  # the SwiGLU reference in the activation dtype
    out = skinny_gemm(gate_up, weight, bias, config=SMALL_TILE, silu_mul_input=True)
    expected = reference(activation, weight, bias)
    # the interpreter truncates the activation's bf16 roundings: an error of one unit in each
    # input, summed over the depth, is relative to the outputs' scale, not to each output
    scale = None if rounded_like_torch(device, dtype) else expected.abs().max().item()
    assert_computed_close(out, expected, scale)


def test_row_parallel_down_proj_fuses_the_activation_only_for_a_decode_steps_rows(
    device: torch.device,
) -> None:
    requires_triton(device)
    down = RowParallelLinear(DEPTH, COLS, bias=True, fused_kernels=True).to(device)
    few, _, _ = operands(3, 2 * DEPTH, torch.float32, device, seed=1)
    many, _, _ = operands(MAX_ROWS + 1, 2 * DEPTH, torch.float32, device, seed=2)
    assert down.streams(few) and not down.streams(many)
    gate, up = few.chunk(2, dim=-1)
    with torch.no_grad():
        assert_computed_close(
            down(few, silu_mul_input=True), reference(F.silu(gate) * up, down.weight, down.bias)
        )
        with pytest.raises(ValueError, match="weight-stream"):
            down(many, silu_mul_input=True)


def test_inputs_it_cannot_stream_are_refused() -> None:
    weight = torch.zeros(8, 16)
    with pytest.raises(ValueError, match="rows ≤"):
        skinny_gemm(torch.zeros(MAX_ROWS + 1, 16), weight)
    with pytest.raises(ValueError, match="2·K with silu_mul_input"):
        skinny_gemm(torch.zeros(2, 16), weight, silu_mul_input=True)
    with pytest.raises(ValueError, match="unit column stride"):
        skinny_gemm(torch.zeros(16, 2).t(), weight)


LLAMA_8B = [  # (input width, output width, silu_mul_input): o_proj, down_proj, lm_head
    (4096, 4096, False),
    (2 * 14336, 4096, True),
    (4096, 128256, False),
]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(("width", "cols", "silu_mul_input"), LLAMA_8B)
def test_the_default_tiles_fit_the_gpu_at_every_row_count_of_a_decode_bucket(
    width: int, cols: int, silu_mul_input: bool
) -> None:
    generator = torch.Generator().manual_seed(cols)
    depth = width // 2 if silu_mul_input else width
    weight = (torch.randn(cols, depth, generator=generator) / depth**0.5).to("cuda", torch.bfloat16)
    for rows in (1, 2, 4, 8, 16, 24, 32, 48, 64):
        x = torch.randn(rows, width, generator=generator).to("cuda", torch.bfloat16)
        config = default_config(cols, rows, silu_mul_input)
        out = skinny_gemm(x, weight, silu_mul_input=silu_mul_input)
        if silu_mul_input:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        assert_computed_close(out, reference(x, weight, None)), config
