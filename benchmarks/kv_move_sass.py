# mypy: allow-untyped-calls
"""Benchmark aid: compile the KV mover's small-move launches for sm_90 offline and report them.

No GPU needed: Triton compiles for ``GPUTarget("cuda", 90, 64)`` and its bundled ptxas reports
registers and spills. For the Llama-3.1-8B layout (64 buffers of 2 KiB rows) and bs·6 pairs,
one row per move, with and without ``independent_groups=6``: grid (programs x warps), the
register block (pairs x words), and of the compiled kernel the registers, spill bytes, 16-byte
global loads/stores and how many global loads come before the first branch (pair and table
loads that the rows wait for in parallel). Moves that take no single launch say so.

    PYTHONPATH=$PWD python3 -m benchmarks.kv_move_sass

To compare with another revision, run it in that revision's checkout (or an arm of
``scripts/ab-arms.sh``): the kernel and launch-shape names it uses are this revision's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from typing import Any

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from eagletree.adapters.kernels.triton import kv_move
from eagletree.adapters.kernels.triton.kv_move_table import Tuning, build_row_table, segment_launch

TARGET = GPUTarget("cuda", 90, 64)
BATCH_SIZES = (1, 8, 64, 256)


def compile_kernel(fn: Any, ints: dict[str, int], constexprs: dict[str, Any], warps: int) -> Any:
    """Compile ``fn`` as Triton's launcher would specialise it: 16-byte aligned pointers, ints
    divisible by 16 marked so, 1 folded to a constant."""
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    constants = dict(constexprs)
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ints:
            value = ints[name]
            if value == 1:
                signature[name], constants[name] = "constexpr", 1
            else:
                signature[name] = "i32"
                if value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "*i64"
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constants, attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": warps})


def report(kernel: Any) -> str:
    ptx: str = kernel.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as file:
        file.write(ptx)
        file.flush()
        out = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", file.name, "-o", os.devnull],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    body = ptx[ptx.index("{") :]
    first_branch = re.search(r"\bbra\b|\bret;", body)
    before = body[: first_branch.start()] if first_branch else body
    return (
        f"{regs.group(1) if regs else '?'} | "
        f"{'/'.join(spills.groups()) if spills else '?'} | "
        f"{len(re.findall(r'ld[.]global[.]v4', ptx))}/{len(re.findall(r'st[.]global[.]v4', ptx))}"
        f" of {len(re.findall(r'ld[.]global', ptx))}/{len(re.findall(r'st[.]global', ptx))} | "
        f"{len(re.findall(r'ld[.]global', before))}"
    )


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        description="Compile the KV mover's small-move launches for sm_90 and report them."
    ).parse_args(argv)
    buffers = tuple(torch.zeros(4, 8, 128, dtype=torch.bfloat16) for _ in range(64))
    print(
        "| pairs | mover | programs x warps | pairs x words | registers | spill st/ld bytes"
        " | v4 ld/st of all ld/st | loads before the first branch |"
    )
    print("|---|---|---|---|---|---|---|---|")
    table = build_row_table(buffers)
    for bs in BATCH_SIZES:
        pairs = bs * 6
        for hint in (None, 6):
            name = "grouped" if hint else "triton"
            launch = segment_launch(table, pairs, hint, Tuning())
            if launch is None:
                print(f"| {pairs} | {name} | gather/scatter | | | | | |")
                continue
            (segments, num_buffers, tiles), shape = launch.grid, launch.shape
            kernel = compile_kernel(
                kv_move._move_rows_kernel,
                {"num_moves": pairs, "pairs_per_segment": launch.pairs_per_segment},
                {"WORD": tl.int32, "VEC": 4, "LANES": shape.lanes, "TILE": shape.tile},
                shape.num_warps,
            )
            print(
                f"| {pairs} | {name} | {segments * num_buffers * tiles} x {shape.num_warps} "
                f"| {shape.lanes} x {shape.tile} | {report(kernel)} |"
            )


if __name__ == "__main__":
    main()
