"""GPU: the fused kernels launch without host syncs and replay in a CUDA graph on new inputs.

Captured once on static buffers, then replayed after new values (new slots included) are copied
in: the outputs and the pool rows must equal an eager run of the same kernels bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from eagletree.adapters.kernels.triton.mla_rope_kv_store import mla_rope_kv_store
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from tests.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

TOKENS, HIDDEN, INTER, HEADS, KV_HEADS, DIM, SLOTS, RANK, ROPE = 7, 80, 112, 4, 2, 24, 64, 40, 12
Inputs = dict[str, torch.Tensor]


def random_inputs(seed: int) -> Inputs:
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device="cuda").to(torch.bfloat16)

    return {
        "x": randn(TOKENS, HIDDEN),
        "residual": randn(TOKENS, HIDDEN),
        "gate_up": randn(TOKENS, 2 * INTER),
        "qkv": randn(TOKENS, (HEADS + 2 * KV_HEADS) * DIM),
        "cos": randn(TOKENS, DIM),
        "sin": randn(TOKENS, DIM),
        "mla_q": randn(TOKENS, HEADS, ROPE),
        "compressed": randn(TOKENS, RANK + ROPE),
        "mla_cos": randn(TOKENS, ROPE),
        "mla_sin": randn(TOKENS, ROPE),
        "loc": torch.randperm(SLOTS, generator=generator, device="cuda")[:TOKENS] + 1,
    }


def fused_step(inputs: Inputs, pools: Inputs, weight: torch.Tensor) -> list[torch.Tensor]:
    q, k, v = torch.split(inputs["qkv"], [HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
    compressed = inputs["compressed"]
    normed, _ = fused_add_rmsnorm(inputs["x"], inputs["residual"], weight, 1e-5)
    return [
        normed,
        rmsnorm(inputs["x"], weight, 1e-5),
        silu_and_mul(inputs["gate_up"]),
        rope_kv_store(
            q.view(TOKENS, HEADS, DIM), k.view(TOKENS, KV_HEADS, DIM),
            v.view(TOKENS, KV_HEADS, DIM), inputs["cos"], inputs["sin"], inputs["loc"],
            pools["k"], pools["v"],
        ),
        mla_rope_kv_store(
            inputs["mla_q"], compressed[:, :RANK], compressed[:, RANK:], weight[:RANK], 1e-5,
            inputs["mla_cos"], inputs["mla_sin"], True, inputs["loc"], pools["mla"],
        )[..., RANK:],  # its latent columns are the caller's to fill
    ]  # fmt: skip


def empty_pools() -> Inputs:
    def zeros(*size: int) -> torch.Tensor:
        return torch.zeros(*size, device="cuda", dtype=torch.bfloat16)

    return {
        "k": zeros(SLOTS + 1, KV_HEADS, DIM),
        "v": zeros(SLOTS + 1, KV_HEADS, DIM),
        "mla": zeros(SLOTS + 1, 1, RANK + ROPE),
    }


def capture(
    fn: Callable[[], list[torch.Tensor]],
) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compilation) off the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def test_the_fused_kernels_replay_in_a_cuda_graph_on_new_inputs_without_host_syncs() -> None:
    weight = 1 + 0.1 * torch.randn(HIDDEN, device="cuda").to(torch.bfloat16)
    static, static_pools = random_inputs(1), empty_pools()
    graph, outputs = capture(lambda: fused_step(static, static_pools, weight))

    fresh = random_inputs(2)
    eager_inputs, eager_pools = {k: t.clone() for k, t in fresh.items()}, empty_pools()
    torch.cuda.set_sync_debug_mode("error")
    try:
        expected = fused_step(eager_inputs, eager_pools, weight)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    for name, tensor in fresh.items():
        static[name].copy_(tensor)
    for pool in static_pools.values():
        pool.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for ours, reference in zip(outputs, expected, strict=True):
        assert torch.equal(ours, reference)
    assert torch.equal(static["residual"], eager_inputs["residual"])  # updated in place
    for name in static_pools:
        assert torch.equal(static_pools[name], eager_pools[name])
