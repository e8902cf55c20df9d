"""``gemm.py --in-layer``: a verify's MLP GEMMs alone and inside the MLP block, per kernel.

Llama-3.1-8B's MLP (hidden 4096, intermediate 14 336, bf16) over ``LAYERS`` layers' distinct
weights, so that no weight is served from L2. Two CUDA graphs: the merged gate/up GEMMs back to
back, and whole blocks as a step runs them at more than 64 rows (add + RMSNorm, gate/up,
SiLU-and-mul, down). Each graph is replayed for the asked span first — a sustained run is where
the GPU's clock may fall under its power limit — then timed (the median replay), then three
more replays run under the profiler, whose per-kernel durations the table reports (µs per call,
averaged over the calls of one name). Times are printed, never asserted.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.timing import launched_kernels, median_us
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul

HIDDEN, INTERMEDIATE, LAYERS = 4096, 14336, 16
PROFILED_REPLAYS = 3


def _graph(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    body()  # compiles the Triton kernels, warms cuBLAS
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def _kernel_us(
    graph: torch.cuda.CUDAGraph, sustain_ms: float, device: torch.device
) -> tuple[dict[str, tuple[float, float]], float]:
    """({kernel name: (calls a replay, µs a call)}, µs a replay) after replaying ``graph``
    for the span."""
    end = time.perf_counter() + sustain_ms / 1e3
    while time.perf_counter() < end:
        for _ in range(4):
            graph.replay()
        torch.cuda.synchronize()
    replay_us = median_us(graph.replay, device, rep_ms=30, flush_l2=False)

    def replays() -> None:
        for _ in range(PROFILED_REPLAYS):
            graph.replay()

    launched = launched_kernels(replays, device)
    assert launched is not None  # the caller checked for CUDA
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, us in launched:
        sums[name][0] += 1
        sums[name][1] += us
    per_call = {
        name: (count / PROFILED_REPLAYS, total / count) for name, (count, total) in sums.items()
    }
    return per_call, replay_us


def _bodies(
    x: torch.Tensor, residual: torch.Tensor, gate_up: list[torch.Tensor], down: list[torch.Tensor]
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The two graphs' bodies: gate/up GEMMs back to back, and whole MLP blocks."""
    norm_weight = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    stream = torch.empty_like(residual)  # the sums go here, so that replays see fixed inputs

    def gemms_alone() -> None:
        for w in gate_up:
            F.linear(x, w)

    def mlp_blocks() -> None:
        h = x
        for w_gate_up, w_down in zip(gate_up, down, strict=True):
            normed, _ = fused_add_rmsnorm(h, residual, norm_weight, 1e-5, stream)
            h = F.linear(silu_and_mul(F.linear(normed, w_gate_up)), w_down)

    return gemms_alone, mlp_blocks


def in_layer_table(rows_list: list[int], spans_ms: list[float], device: torch.device) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=gen) * scale).to(dtype).to(device)

    gate_up = [randn(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5) for _ in range(LAYERS)]
    down = [randn(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5) for _ in range(LAYERS)]
    lines = [
        "| rows | replayed ms | graph | kernel | calls / replay | µs a call |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for rows in rows_list:
        x, residual = randn(rows, HIDDEN), randn(rows, HIDDEN)
        gemms_alone, mlp_blocks = _bodies(x, residual, gate_up, down)
        graphs = {"gate/up alone": _graph(gemms_alone), "MLP blocks": _graph(mlp_blocks)}
        for span in spans_ms:
            for label, graph in graphs.items():
                per_call, replay_us = _kernel_us(graph, span, device)
                ranked = sorted(per_call.items(), key=lambda item: -item[1][0] * item[1][1])
                for name, (calls, us) in ranked:
                    line = (
                        f"| {rows} | {span:g} | {label} ({replay_us:.0f} µs a replay) |"
                        f" `{name[:60]}` | {calls:g} | {us:.1f} |"
                    )
                    lines.append(line)
                    print(line, flush=True)
    return lines
