"""Benchmark: the linear layers of a decode step at few rows — cuBLAS, cuBLASLt, and the Triton
weight-stream kernel (``skinny_gemm``) over a sweep of its tile configurations.

Shapes are Llama-3.1-8B's (bf16): the merged q/k/v (4096 → 6144), o (4096 → 4096), merged
gate/up (4096 → 28 672), down (14 336 → 4096) and the lm_head (4096 → 128 256), at 1–64 rows
(plain decode at bs 1–64, a tree verify at bs 1 and 8, the draft's k rows per request). As in
the model, every call reads a different weight: one CUDA graph runs the GEMM over ``LAYERS``
distinct weights back to back (fewer for the 1 GB lm_head), so nothing is served from L2 and no
launch is timed. "µs" is the graph's median replay (``triton.testing.do_bench``) divided by
the calls in it; "TB/s" counts the weight, input and output bytes once. Each Triton config's
output is checked against ``F.linear`` first (bf16 tolerance); a config that does not fit the
shared memory is skipped. Times are printed, never asserted.

``--fp8`` times the kernel on FP8 weights (``quantize_rows``) against cuBLAS on the bf16
weights they replace, at the shapes of an EAGLE-3 head for Llama-3.1-8B (its q/k/v read an
8192-wide input, its lm_head a 32k draft vocabulary) and up to 256 rows (a tree step's draft
rows at bs 32 and more), with the default tile's time beside the best.

    PYTHONPATH=$PWD python3 benchmarks/gemm.py --out gemm.md [--quick] [--fp8]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/gemm.py --smoke [--fp8]
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from eagletree.adapters.kernels.triton.skinny_gemm import SkinnyConfig, skinny_gemm
from eagletree.adapters.models.streamed_linear import dequantize_rows, quantize_rows


class Shape(NamedTuple):
    name: str
    k: int
    n: int
    copies: int  # distinct weights per graph


LLAMA_8B = (
    Shape("qkv", 4096, 6144, 32),
    Shape("o", 4096, 4096, 32),
    Shape("gate_up", 4096, 28672, 16),
    Shape("down", 14336, 4096, 16),
    Shape("lm_head", 4096, 128256, 4),
)
EAGLE3_HEAD_8B = (
    Shape("qkv", 8192, 6144, 32),
    Shape("o", 4096, 4096, 32),
    Shape("gate_up", 4096, 28672, 16),
    Shape("down", 14336, 4096, 16),
    Shape("lm_head", 4096, 32000, 16),
)
SMOKE = (Shape("qkv", 64, 96, 2), Shape("o", 64, 64, 2))
ROWS = (1, 4, 8, 16, 32, 64)
FP8_ROWS = (1, 4, 16, 64, 128, 256)


def configs(quick: bool, fp8: bool = False) -> list[SkinnyConfig]:
    if quick and fp8:  # the bf16 sweep's winners' neighbourhood, and twice the K step
        return [
            SkinnyConfig(*c) for c in itertools.product((32, 64), (256, 512, 1024), (4,), (3, 4))
        ]
    blocks_n = (16, 32, 64)
    blocks_k = (128, 256, 512, 1024) if fp8 else (128, 256, 512)
    warps = (4,) if quick else (4, 8)
    stages = (3, 4) if quick else (3, 4, 5)
    return [SkinnyConfig(*c) for c in itertools.product(blocks_n, blocks_k, warps, stages)]


def replay_us(calls: list[Callable[[], object]], device: torch.device) -> float:
    """Median µs per call of ``calls`` run back to back, replayed from one CUDA graph."""
    if device.type != "cuda":
        start = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - start) * 1e6 / len(calls)
    import triton.testing

    for call in calls:  # compiles, warms cuBLAS's handles
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = triton.testing.do_bench(graph.replay, warmup=5, rep=30, return_mode="median")
    return float(ms) * 1e3 / len(calls)


def measure(
    shape: Shape, rows: int, cfgs: list[SkinnyConfig], device: torch.device, fp8: bool = False
) -> str:
    gen = torch.Generator().manual_seed(rows)
    dtype = torch.bfloat16
    weights = [
        (torch.randn(shape.n, shape.k, generator=gen) / shape.k**0.5).to(dtype).to(device)
        for _ in range(shape.copies)
    ]
    x = torch.randn(rows, shape.k, generator=gen).to(dtype).to(device)
    reference = F.linear(x.float(), weights[0].float())
    moved = (shape.n * shape.k + rows * (shape.k + shape.n)) * 2
    if fp8:
        return _measure_fp8(shape, rows, cfgs, device, weights, x, moved)

    def tbps(us: float) -> float:
        return moved / (us * 1e-6) / 1e12

    cublas = replay_us([partial(F.linear, x, w) for w in weights], device)
    lt = float("nan")
    if device.type == "cuda":
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            lt = replay_us([partial(F.linear, x, w) for w in weights], device)
        finally:
            torch.backends.cuda.preferred_blas_library(previous)
    best: tuple[float, SkinnyConfig] | None = None
    for cfg in cfgs:
        try:
            out = skinny_gemm(x, weights[0], config=cfg)
        except OutOfResources:  # a tile that does not fit the shared memory
            continue
        error = (out.float() - reference).abs().max().item()
        if error > 0.05 * reference.abs().max().item() + 1e-2:
            raise AssertionError(f"{shape.name} rows {rows} {cfg}: max error {error}")
        us = replay_us([partial(skinny_gemm, x, w, config=cfg) for w in weights], device)
        if best is None or us < best[0]:
            best = (us, cfg)
    assert best is not None, "no Triton config ran"
    triton_us, cfg = best
    return (
        f"| {shape.name} {shape.k}→{shape.n} | {rows} | {cublas:.1f} ({tbps(cublas):.2f}) |"
        f" {lt:.1f} ({tbps(lt):.2f}) | {triton_us:.1f} ({tbps(triton_us):.2f}) |"
        f" n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} |"
        f" {cublas / triton_us:.2f} |"
    )


def _measure_fp8(
    shape: Shape,
    rows: int,
    cfgs: list[SkinnyConfig],
    device: torch.device,
    weights: list[torch.Tensor],
    x: torch.Tensor,
    bf16_bytes: int,
) -> str:
    """cuBLAS on the bf16 weights, the kernel on their FP8 rows (best tile and default)."""
    quantized = [quantize_rows(w) for w in weights]
    reference = F.linear(x.float(), dequantize_rows(*quantized[0], torch.float32))
    fp8_bytes = shape.n * shape.k + 4 * shape.n + rows * (shape.k + shape.n) * 2
    cublas = replay_us([partial(F.linear, x, w) for w in weights], device)

    def run(cfg: SkinnyConfig | None) -> float:
        out = skinny_gemm(x, quantized[0][0], config=cfg, weight_scale=quantized[0][1])
        error = (out.float() - reference).abs().max().item()
        if error > 0.05 * reference.abs().max().item() + 1e-2:
            raise AssertionError(f"{shape.name} rows {rows} {cfg}: max error {error}")
        calls: list[Callable[[], object]] = [
            partial(skinny_gemm, x, q, config=cfg, weight_scale=s) for q, s in quantized
        ]
        return replay_us(calls, device)

    best: tuple[float, SkinnyConfig] | None = None
    for cfg in cfgs:
        try:
            us = run(cfg)
        except OutOfResources:
            continue
        if best is None or us < best[0]:
            best = (us, cfg)
    assert best is not None, "no Triton config ran"
    default_us = run(None)
    fp8_us, cfg = best
    return (
        f"| {shape.name} {shape.k}→{shape.n} | {rows} |"
        f" {cublas:.1f} ({bf16_bytes / cublas / 1e6:.2f}) |"
        f" {fp8_us:.1f} ({fp8_bytes / fp8_us / 1e6:.2f}) |"
        f" n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} |"
        f" {default_us:.1f} | {cublas / default_us:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="markdown file for the table")
    parser.add_argument("--quick", action="store_true", help="fewer Triton configs")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--fp8", action="store_true", help="FP8 weights, an EAGLE-3 head's shapes")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shapes = SMOKE if args.smoke else EAGLE3_HEAD_8B if args.fp8 else LLAMA_8B
    rows_list: tuple[int, ...] = (1, 8) if args.smoke else ROWS
    if args.fp8 and not args.smoke:
        rows_list = FP8_ROWS[::2] if args.quick else FP8_ROWS
    cfgs = [SkinnyConfig(16, 32, 4, 2)] if args.smoke else configs(args.quick, args.fp8)
    if args.fp8:
        lines = [
            "| GEMM | rows | cuBLAS bf16 µs (TB/s) | FP8 kernel best µs (TB/s) | best config |"
            " FP8 default µs | cuBLAS bf16 ÷ FP8 default |",
            "|---|---|---|---|---|---|---|",
        ]
    else:
        lines = [
            "| GEMM | rows | cuBLAS µs (TB/s) | cuBLASLt µs (TB/s) | Triton best µs (TB/s) |"
            " best config | cuBLAS ÷ Triton |",
            "|---|---|---|---|---|---|---|",
        ]
    print("\n".join(lines), flush=True)
    for shape in shapes:
        for rows in rows_list:
            line = measure(shape, rows, cfgs, device, args.fp8)
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
