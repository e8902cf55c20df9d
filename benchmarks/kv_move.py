"""Benchmark: KV compaction moves, torch (gather/scatter per buffer) vs the fused Triton mover.

Layouts: Llama-3.1-8B (32 layers, K and V of 8 heads x 128, bf16: 64 buffers of 2 KiB rows),
DeepSeek MLA (61 layers x 576 bf16: 61 buffers of 1152 B rows) and DSA (MLA plus per layer fp8
indexer keys of 128 B and an fp32 scale: 183 buffers). Moves: bs·(S+1) pairs for bs in
{1, 8, 64, 256}, S+1 = 6, plus one 65 536-pair move, shaped like compaction plans: every request
owns a window of N = 16 scattered slots and moves the nodes of an accepted path (increasing, so
targets and sources overlap) to the window's front. "reversed" is the 65 536-pair move in reverse
pair order (its groups no longer start at multiples of 6); "cycle" is one 65 536-slot cycle whose
closing pair spans the whole move, which forces the Triton mover's scratch fallback.

Columns: "triton" is ``TritonRowMover().move(buffers, tgt, src)`` (no hint: one launch up to 512
pairs, else the device segment plan); "grouped" adds ``independent_groups=6`` (one launch), shown
only where that promise holds. Bytes = 2 x (pairs with tgt != src) x bytes per slot over all
buffers (read + written); self-moves are not counted. Times are medians of
``triton.testing.do_bench`` (CUDA events, L2 flushed) on random data; "exact" says every mover
timed on that row left the targets equal to the sources gathered before the move and a sample of
the other rows untouched, bit for bit.

``--variants all`` (or a comma list of names, see ``TUNING``) adds a second table with one row
per (layout, move, variant): the same kernels with other staging, tile and warp settings.

    PYTHONPATH=$PWD python3 benchmarks/kv_move.py --out kv_move.md [--variants all]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/kv_move.py --smoke --variants all
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from eagletree.adapters.memory.row_movers import (
    TorchRowMover,
    TritonRowMover,
    check_independent_groups,
)

STEPS_PLUS_ONE = 6
WINDOW = 16
BATCH_SIZES = (1, 8, 64, 256)
BIG_MOVE = 65_536
Mover = TorchRowMover | TritonRowMover


class Variant(NamedTuple):
    make: Callable[[], Mover]
    grouped: bool  # passes independent_groups=STEPS_PLUS_ONE (rows where the promise holds)


DEFAULT = {
    "torch": Variant(TorchRowMover, grouped=False),
    "triton": Variant(TritonRowMover, grouped=False),
    "grouped": Variant(TritonRowMover, grouped=True),
}
TUNING = {
    # grouped: pairs staged per program (whole groups of 6), register block, warps, tile
    "grouped lanes=8": Variant(lambda: TritonRowMover(group_lanes=8), grouped=True),
    "grouped lanes=16": Variant(lambda: TritonRowMover(group_lanes=16), grouped=True),
    "grouped lanes=64": Variant(lambda: TritonRowMover(group_lanes=64), grouped=True),
    "grouped regs=4096": Variant(lambda: TritonRowMover(register_words=4096), grouped=True),
    "grouped regs=16384": Variant(lambda: TritonRowMover(register_words=16384), grouped=True),
    "grouped warps=4": Variant(lambda: TritonRowMover(num_warps=4), grouped=True),
    "grouped warps=16": Variant(lambda: TritonRowMover(num_warps=16), grouped=True),
    "grouped tile=64": Variant(lambda: TritonRowMover(tile_words=64), grouped=True),
    "grouped tile=512": Variant(lambda: TritonRowMover(tile_words=512), grouped=True),
    # no hint: where the one-launch staged path stops, and the planned segment size
    "staged<=64": Variant(lambda: TritonRowMover(max_staged_moves=64), grouped=False),
    "staged<=2048": Variant(
        lambda: TritonRowMover(max_staged_moves=2048, register_words=16384), grouped=False
    ),
    "plan lanes=32": Variant(lambda: TritonRowMover(plan_lanes=32), grouped=False),
    "plan lanes=128": Variant(
        lambda: TritonRowMover(plan_lanes=128, plan_window=32, register_words=16384),
        grouped=False,
    ),
    "plan regs=4096": Variant(lambda: TritonRowMover(register_words=4096), grouped=False),
    "scratch=1GiB": Variant(lambda: TritonRowMover(scratch_bytes=1 << 30), grouped=False),
}


def layout_buffers(
    name: str, num_rows: int, device: torch.device, layers: int | None
) -> tuple[torch.Tensor, ...]:
    """Random-filled buffers of one layout, in pool order (never zeros: zeros hide bugs)."""
    bf16 = torch.bfloat16

    def randomised(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=device)
        words = buf.view(torch.uint8) if buf.element_size() == 1 else buf.view(torch.int16)
        words.random_()  # random bit patterns, any dtype
        return buf

    if name == "llama":
        n = 32 if layers is None else layers
        return tuple(randomised((num_rows, 8, 128), bf16) for _ in range(2 * n))
    n = 61 if layers is None else layers
    latent = [randomised((num_rows, 1, 576), bf16) for _ in range(n)]
    if name == "mla":
        return tuple(latent)
    assert name == "dsa"
    index_k = [randomised((num_rows, 128), torch.float8_e4m3fn) for _ in range(n)]
    scales = [randomised((num_rows,), torch.float32) for _ in range(n)]
    return tuple(b for layer in zip(latent, index_k, scales, strict=True) for b in layer)


def compaction_moves(
    num_pairs: int, num_rows: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (tgt, src) of full-length accepted paths in scattered windows of WINDOW slots."""
    requests = -(-num_pairs // STEPS_PLUS_ONE)
    windows = torch.randperm(num_rows - 1, generator=gen)[: requests * WINDOW] + 1
    windows = windows.view(requests, WINDOW)
    # path: node 0 (the root) then STEPS_PLUS_ONE - 1 increasing nodes, so node k >= k
    later = torch.rand(requests, WINDOW - 1, generator=gen).argsort(dim=1)[:, : STEPS_PLUS_ONE - 1]
    path = torch.cat([torch.zeros(requests, 1, dtype=torch.int64), later.sort(dim=1).values + 1], 1)
    tgt = windows[:, :STEPS_PLUS_ONE].reshape(-1)[:num_pairs]
    src = windows.gather(1, path).reshape(-1)[:num_pairs]
    return tgt, src


def make_moves(
    order: str, num_pairs: int, num_rows: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    if order == "cycle":
        tgt = torch.randperm(num_rows - 1, generator=gen)[:num_pairs] + 1
        return tgt, tgt.roll(1)
    tgt, src = compaction_moves(num_pairs, num_rows, gen)
    return (tgt.flip(0), src.flip(0)) if order == "reversed" else (tgt, src)


def hint_holds(tgt: torch.Tensor, src: torch.Tensor) -> bool:
    try:
        check_independent_groups(tgt, src, STEPS_PLUS_ONE)
    except ValueError:
        return False
    return True


def median_us(fn: Callable[[], None], device: torch.device, rep_ms: int) -> float:
    if device.type == "cuda":
        import triton.testing

        ms: float = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
        return ms * 1e3
    samples = []
    for _ in range(1):  # the CPU run (smoke, interpreter) only checks that everything runs
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def count_launches(fn: Callable[[], None], device: torch.device) -> int | None:
    """Kernels one call launches, from the CUDA profiler (None where it cannot tell)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return len([event for event in prof.events() if event.device_type.name == "CUDA"])


def copy_bandwidth_gbs(device: torch.device, num_bytes: int) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    us = median_us(copy, device, 200)
    return 2 * num_bytes / us / 1e3


def check_exact(
    move: Callable[[], None], buffers: tuple[torch.Tensor, ...], tgt: torch.Tensor,
    src: torch.Tensor, untouched: torch.Tensor,
) -> bool:  # fmt: skip
    """One move against the gathered sources (distinct targets), plus rows no pair targets."""
    expected = [buf[src] for buf in buffers]
    before = [buf[untouched] for buf in buffers]
    move()
    return all(
        torch.equal(buf[tgt].view(torch.uint8), want.view(torch.uint8))
        and torch.equal(buf[untouched].view(torch.uint8), old.view(torch.uint8))
        for buf, want, old in zip(buffers, expected, before, strict=True)
    )


class Timing(NamedTuple):
    us: float
    launches: int | None
    exact: bool


def run(args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    layers = 1 if args.smoke else None
    sizes = (1, 8) if args.smoke else BATCH_SIZES
    big = 600 if args.smoke else BIG_MOVE  # the smoke run still crosses the staged cap
    copy_gbs = copy_bandwidth_gbs(device, (1 << 20) if args.smoke else (1 << 30))
    chosen = {} if not args.variants else TUNING if args.variants == "all" else {
        name: TUNING[name] for name in args.variants.split(",")
    }  # fmt: skip
    variants = {**DEFAULT, **chosen}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (
        f"device: {name}; torch {torch.__version__}; copy bandwidth {copy_gbs:.0f} GB/s"
        " (1 GiB device copy, read + write)"
    )
    table = [
        "| layout | pairs | MB moved | torch µs | torch GB/s | triton µs | triton GB/s"
        " | triton % copy | speedup | launches torch/triton/grouped | grouped µs"
        " | grouped % copy | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tuning = [
        "| layout | pairs | variant | µs | GB/s | % copy | launches | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cases = [(f"bs={bs}", bs * STEPS_PLUS_ONE, "forward") for bs in sizes]
    cases += [(f"{big}", big, "forward"), (f"{big} reversed", big, "reversed")]
    cases += [(f"{big} cycle", big, "cycle")]
    for layout in args.layouts.split(","):
        num_rows = -(-big // STEPS_PLUS_ONE) * WINDOW + 1
        buffers = layout_buffers(layout, num_rows, device, layers)
        slot_bytes = sum(buf[0].numel() * buf.element_size() for buf in buffers)
        for label, pairs, order in cases:
            tgt, src = make_moves(order, pairs, num_rows, gen)
            grouped_ok = hint_holds(tgt, src)
            targeted = torch.zeros(num_rows, dtype=torch.bool)
            targeted[tgt] = True
            untouched = (~targeted).nonzero().squeeze(1)[:1024].to(device)
            tgt, src = tgt.to(device), src.to(device)
            moved = int((tgt != src).sum())  # SYNC: benchmark set-up
            mb = 2 * moved * slot_bytes / 1e6
            timings: dict[str, Timing] = {}
            for key, variant in variants.items():
                if variant.grouped and not grouped_ok:
                    continue
                mover = variant.make()  # fresh per row: a mover's table cache holds buffers
                hint = STEPS_PLUS_ONE if variant.grouped else None
                call = partial(mover.move, buffers, tgt, src, independent_groups=hint)
                exact = check_exact(call, buffers, tgt, src, untouched)
                timings[key] = Timing(
                    median_us(call, device, args.rep_ms), count_launches(call, device), exact
                )
                if args.variants:
                    t = timings[key]
                    gbs = mb / t.us * 1e3
                    tuning.append(
                        f"| {layout} | {label} ({pairs}) | {key} | {t.us:.1f} | {gbs:.0f} "
                        f"| {100 * gbs / copy_gbs:.0f} % | {t.launches} "
                        f"| {'yes' if t.exact else 'NO'} |"
                    )
                    print(tuning[-1], flush=True)
            table.append(default_row(layout, label, pairs, mb, timings, copy_gbs))
            print(table[-1], flush=True)
        del buffers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    tables = [header, "", *table]
    if args.variants:
        tables += ["", "Variants (one row per mover configuration):", "", *tuning]
    return "\n".join(tables)


def default_row(
    layout: str, label: str, pairs: int, mb: float, timings: dict[str, Timing], copy_gbs: float
) -> str:
    torch_t, triton_t = timings["torch"], timings["triton"]
    grouped_t = timings.get("grouped")
    triton_gbs = mb / triton_t.us * 1e3
    grouped = (
        (f"{grouped_t.us:.1f}", f"{100 * mb / grouped_t.us * 1e3 / copy_gbs:.0f} %")
        if grouped_t
        else ("—", "—")
    )
    launches = "/".join(str(t.launches) if t else "—" for t in (torch_t, triton_t, grouped_t))
    exact = all(t.exact for t in timings.values())
    return (
        f"| {layout} | {label} ({pairs}) | {mb:.1f} | {torch_t.us:.1f} "
        f"| {mb / torch_t.us * 1e3:.0f} | {triton_t.us:.1f} | {triton_gbs:.0f} "
        f"| {100 * triton_gbs / copy_gbs:.0f} % | {torch_t.us / triton_t.us:.1f}x "
        f"| {launches} | {grouped[0]} | {grouped[1]} | {'yes' if exact else 'NO'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the markdown tables to this path")
    parser.add_argument("--layouts", default="llama,mla,dsa")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check it runs")
    parser.add_argument(
        "--variants", default="", help=f"'all' or a comma list of: {', '.join(TUNING)}"
    )
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench time per row")
    args = parser.parse_args()
    table = run(args)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as out:
            out.write(table + "\n")


if __name__ == "__main__":
    main()
