"""Benchmark: the linear layers of a decode step at few rows — cuBLAS, cuBLASLt, and the Triton
weight-stream kernel (``skinny_gemm``) over a sweep of its tile configurations.

Shapes are Llama-3.1-8B's (bf16): the merged q/k/v (4096 → 6144), o (4096 → 4096), merged
gate/up (4096 → 28 672), down (14 336 → 4096), the lm_head (4096 → 128 256), a 32k draft
lm_head and EAGLE-3's fc (12 288 → 4096), at 1–64 rows (plain decode at bs 1–64, a tree verify
at bs 1 and 8, the draft's k rows per request); ``--rows`` above 64 (a bs-32 verify's 256, its
drafts' 128) measure the two BLAS paths only, which the engine takes there, and name the
kernels cuBLAS launched (in the "best config" column), to set beside a step's profile. As in
the model, every call reads a different weight: one CUDA graph runs the GEMM over ``LAYERS``
distinct weights back to back (fewer for the 1 GB lm_head), so nothing is served from L2 and no
launch is timed. "µs" is the graph's median replay (``timing.replay_us``) divided by
the calls in it; "TB/s" counts the weight, input and output bytes once. Each Triton config's
output is checked against ``F.linear`` first (bf16 tolerance); a config that does not fit the
shared memory is skipped. Times are printed, never asserted.

``--in-layer ROWS…`` asks whether a GEMM costs in a step what it costs alone: over 16 layers'
distinct weights it profiles, per kernel name, one CUDA graph of the gate/up GEMMs back to back
and one of whole MLP blocks as a verify runs them (add + RMSNorm, gate/up, SiLU-and-mul, down),
each replayed for ``--sustain-ms`` (a short burst and a sustained run differ where the GPU's
clock falls under its power limit; sample ``nvidia-smi`` beside it to see).

    python -m benchmarks.gemm --out gemm.md [--quick] [--shapes …] [--rows …]
    python -m benchmarks.gemm --in-layer 256 --sustain-ms 30 3000
    TRITON_INTERPRET=1 python -m benchmarks.gemm --smoke
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from benchmarks.gemm_in_layer import in_layer_table
from benchmarks.printed_table import PrintedTable
from benchmarks.timing import kernel_names, replay_us
from eagletree.adapters.kernels.triton.skinny_gemm import (
    MAX_ROWS,
    SkinnyConfig,
    default_config,
    skinny_gemm,
)


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
    Shape("lm_head_32k", 4096, 32000, 8),  # EAGLE-3's draft vocabulary, a 32k token map
    Shape("eagle3_fc", 12288, 4096, 16),  # EAGLE-3's fc over three target layers' states
)
SMOKE = (Shape("qkv", 64, 96, 2), Shape("o", 64, 64, 2))
ROWS = (1, 4, 8, 16, 32, 64)


def configs(quick: bool) -> list[SkinnyConfig]:
    blocks_n = (16, 32, 64)
    blocks_k = (128, 256, 512)
    warps = (4,) if quick else (4, 8)
    stages = (3, 4) if quick else (3, 4, 5)
    return [SkinnyConfig(*c) for c in itertools.product(blocks_n, blocks_k, warps, stages)]


def measure(shape: Shape, rows: int, cfgs: list[SkinnyConfig], device: torch.device) -> str:
    gen = torch.Generator().manual_seed(rows)
    dtype = torch.bfloat16
    weights = [
        (torch.randn(shape.n, shape.k, generator=gen) / shape.k**0.5).to(dtype).to(device)
        for _ in range(shape.copies)
    ]
    x = torch.randn(rows, shape.k, generator=gen).to(dtype).to(device)
    reference = F.linear(x.float(), weights[0].float())
    moved = (shape.n * shape.k + rows * (shape.k + shape.n)) * 2

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
    if rows > MAX_ROWS:  # the engine takes cuBLAS here: the two BLAS columns and its kernels
        names = kernel_names(partial(F.linear, x, weights[0]), device)
        chosen = "—" if names is None else " + ".join(f"`{name[:48]}`" for name in names)
        return (
            f"| {shape.name} {shape.k}→{shape.n} | {rows} | {cublas:.1f} ({tbps(cublas):.2f}) |"
            f" {lt:.1f} ({tbps(lt):.2f}) | — | {chosen} | — | — |"
        )
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
    default = default_config(shape.n, rows)
    default_us = replay_us([partial(skinny_gemm, x, w, config=default) for w in weights], device)
    return (
        f"| {shape.name} {shape.k}→{shape.n} | {rows} | {cublas:.1f} ({tbps(cublas):.2f}) |"
        f" {lt:.1f} ({tbps(lt):.2f}) | {triton_us:.1f} ({tbps(triton_us):.2f}) |"
        f" n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} |"
        f" {cublas / triton_us:.2f} | {default_us:.1f} (n{default.block_n} k{default.block_k}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="markdown file for the table")
    parser.add_argument("--quick", action="store_true", help="fewer Triton configs")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument(
        "--shapes", nargs="+", metavar="NAME", help="of " + ", ".join(s.name for s in LLAMA_8B)
    )
    parser.add_argument("--rows", nargs="+", type=int, metavar="N", help=f"default {ROWS}")
    parser.add_argument(
        "--in-layer", nargs="+", type=int, metavar="ROWS", help="GEMMs alone vs in MLP blocks"
    )
    parser.add_argument(
        "--sustain-ms", nargs="+", type=float, default=[30.0], help="--in-layer replay spans"
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.in_layer:
        if device.type != "cuda":
            parser.error("--in-layer profiles CUDA kernels: it needs the GPU")
        lines = in_layer_table(args.in_layer, args.sustain_ms, device)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return
    shapes: tuple[Shape, ...] = SMOKE if args.smoke else LLAMA_8B
    if args.shapes:
        unknown = set(args.shapes) - {s.name for s in shapes}
        if unknown:
            parser.error(
                f"unknown --shapes {sorted(unknown)}: choose from {[s.name for s in shapes]}"
            )
        shapes = tuple(s for s in shapes if s.name in args.shapes)
    rows_list = args.rows or ((1, 8) if args.smoke else ROWS)
    cfgs = [SkinnyConfig(16, 32, 4, 2)] if args.smoke else configs(args.quick)
    table = PrintedTable(
        "| GEMM | rows | cuBLAS µs (TB/s) | cuBLASLt µs (TB/s) | Triton best µs (TB/s) |"
        " best config | cuBLAS ÷ Triton | default µs (tile) |",
        "|---|---|---|---|---|---|---|---|",
    )
    for shape in shapes:
        for rows in rows_list:
            table.add(measure(shape, rows, cfgs, device))
    table.write(args.out)


if __name__ == "__main__":
    main()
