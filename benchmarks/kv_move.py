"""Benchmark: KV compaction moves, torch (gather/scatter per buffer) vs the fused Triton mover.

Layouts: Llama-3.1-8B (32 layers, K and V of 8 heads x 128, bf16: 64 buffers of 2 KiB rows),
DeepSeek MLA (61 layers x 576 bf16: 61 buffers of 1152 B rows) and DSA (MLA plus per layer fp8
indexer keys of 128 B and an fp32 scale: 183 buffers). Moves: bs·(S+1) pairs for bs in
{1, 8, 64, 256}, S+1 = 6, plus one 65 536-pair move, shaped like compaction plans: every request
owns a window of N = 16 scattered slots and moves the nodes of an accepted path (increasing, so
targets and sources overlap) to the window's front. One extra row reverses the 65 536-pair move,
which forces the Triton mover's scratch fallback.

Bytes = 2 x (pairs with tgt != src) x bytes per slot over all buffers (read + written); root
self-moves are not counted (the Triton mover skips them, the torch path copies them anyway).
Times are medians of ``triton.testing.do_bench`` (CUDA events, L2 flushed) on random data;
"exact" says every Triton variant matched the gathered sources bit for bit on that move.

    PYTHONPATH=$PWD python3 benchmarks/kv_move.py --out kv_move.md
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/kv_move.py --smoke   # CPU: does it run?
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.ports.memory import RowMover

STEPS_PLUS_ONE = 6
WINDOW = 16
BATCH_SIZES = (1, 8, 64, 256)
BIG_MOVE = 65_536


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


def median_us(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        ms: float = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        return ms * 1e3
    fn()
    samples = []
    for _ in range(3):
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

    us = median_us(copy, device)
    return 2 * num_bytes / us / 1e3


def check_exact(
    mover: RowMover, buffers: tuple[torch.Tensor, ...], tgt: torch.Tensor, src: torch.Tensor
) -> bool:
    """One move against the gathered sources (targets are distinct, padding-free)."""
    expected = [buf[src] for buf in buffers]
    mover.move(buffers, tgt, src)
    return all(
        torch.equal(buf[tgt].view(torch.uint8), want.view(torch.uint8))
        for buf, want in zip(buffers, expected, strict=True)
    )


def make_movers() -> dict[str, RowMover]:
    return {
        "torch": TorchRowMover(),
        "triton": TritonRowMover(),
        # Tuning aids: the same kernels with the staged/chunked threshold moved either way.
        "staged<=2048": TritonRowMover(max_staged_moves=2048, register_words=16384),
        "chunked>48": TritonRowMover(max_staged_moves=48),
    }


def run(args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    layers = 2 if args.smoke else None
    sizes = (1, 8) if args.smoke else BATCH_SIZES
    big = 600 if args.smoke else BIG_MOVE  # the smoke run still crosses the staged cap
    copy_gbs = copy_bandwidth_gbs(device, (1 << 20) if args.smoke else (1 << 30))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [
        f"device: {name}; torch {torch.__version__}; copy bandwidth {copy_gbs:.0f} GB/s"
        " (1 GiB device copy, read + write)",
        "",
        "| layout | pairs | MB moved | torch µs | torch GB/s | triton µs | triton GB/s"
        " | triton % copy | speedup | launches torch/triton | staged≤2048 µs | chunked>48 µs"
        " | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for layout in args.layouts.split(","):
        num_rows = -(-big // STEPS_PLUS_ONE) * WINDOW + 1
        buffers = layout_buffers(layout, num_rows, device, layers)
        movers = make_movers()  # fresh per layout: a mover's table cache holds its buffers
        slot_bytes = sum(buf[0].numel() * buf.element_size() for buf in buffers)
        cases = [(f"bs={bs}", bs * STEPS_PLUS_ONE) for bs in sizes] + [(f"{big}", big)]
        for label, pairs in [*cases, (f"{big} reversed", big)]:
            tgt, src = compaction_moves(pairs, num_rows, gen)
            if label.endswith("reversed"):
                tgt, src = tgt.flip(0), src.flip(0)
            tgt, src = tgt.to(device), src.to(device)
            moved = int((tgt != src).sum())  # SYNC: benchmark set-up
            mb = 2 * moved * slot_bytes / 1e6
            exact = all(
                check_exact(m, buffers, tgt, src) for k, m in movers.items() if k != "torch"
            )
            calls = {key: partial(m.move, buffers, tgt, src) for key, m in movers.items()}
            us = {key: median_us(call, device) for key, call in calls.items()}
            launches = [count_launches(calls[key], device) for key in ("torch", "triton")]
            gbs = {key: mb / t * 1e3 for key, t in us.items()}  # 1 MB/µs = 1000 GB/s
            lines.append(
                f"| {layout} | {label} ({pairs}) | {mb:.1f} | {us['torch']:.1f} "
                f"| {gbs['torch']:.0f} | {us['triton']:.1f} | {gbs['triton']:.0f} "
                f"| {100 * gbs['triton'] / copy_gbs:.0f} % | {us['torch'] / us['triton']:.1f}x "
                f"| {launches[0]}/{launches[1]} | {us['staged<=2048']:.1f} "
                f"| {us['chunked>48']:.1f} | {'yes' if exact else 'NO'} |"
            )
            print(lines[-1], flush=True)
        del buffers, movers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the markdown table to this path")
    parser.add_argument("--layouts", default="llama,mla,dsa")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check it runs")
    args = parser.parse_args()
    table = run(args)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as out:
            out.write(table + "\n")


if __name__ == "__main__":
    main()
