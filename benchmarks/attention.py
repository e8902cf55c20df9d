"""Benchmark: attention backends on Llama-3.1-8B shapes — time and KV bandwidth against a copy.

One layer of 32 q heads, 8 kv heads, head_dim 128, bf16, prefixes on randomly scattered slots
(``attention_setup``). Rows: target verify (a random draft tree of N nodes, FULL_MASK) for bs in
{1, 8, 32, 64}, prefix in {1k, 4k, 16k}, N in {8, 64}; the causal EXTEND of the same shape (N
new tokens per request on the same prefix), whose time is the denominator of the tree-mask
overhead ratio; and decode (one token per request). KV bytes = bs · (prefix + new) · kv_heads ·
(head_dim + v_head_dim) · 2 B read once; bandwidth = KV bytes / median time, shown as a share of
the device-to-device copy bandwidth (bytes read + written) measured in the same run. Times are
``benchmarks.timing.median_us`` (per-call CUDA events, L2 flushed) of
``forward(save_kv=False)`` after one ``init_forward_metadata``, whose own time (once per
forward, shared by all layers) is ``init``; ``err`` is the max |o − o_triton| of the row's
output.

``--key-shapes`` runs only the shapes the attention targets were set on (bs 32 prefix 4k N 8
and 64, bs 64 prefix 16k N 8, decode at both). To compare two revisions of the kernel, run this
benchmark for both as A/B arms (``scripts/ab-arms.sh``, docs/benchmarks.md). ``--tune``,
``--min-chunk-sweep`` and ``--split-sweep`` time Triton's launch options instead
(``attention_sweeps``).

    python -m benchmarks.attention --out attention.md     # full table, H200
    python -m benchmarks.attention --key-shapes --tune --out attention.md
    TRITON_INTERPRET=1 python -m benchmarks.attention --smoke --key-shapes --tune
"""

from __future__ import annotations

import argparse

import torch
import triton

from benchmarks.attention_setup import KV_HEADS, Point, Setup, build_backends, make_setup
from benchmarks.attention_sweeps import min_chunk_sweep, split_sweep, tune
from benchmarks.timing import copy_bandwidth_gbs, median_us
from eagletree.domain.batch import ForwardMode
from eagletree.ports.attention import AttentionBackend


def measure(
    setup: Setup, backend: AttentionBackend, device: torch.device, rep_ms: int
) -> tuple[float, float, torch.Tensor]:
    """(forward µs, init_forward_metadata µs, output) of one layer's attention."""
    batch, q, layer = setup.batch, setup.q, setup.layer
    init_us = median_us(
        lambda: backend.init_forward_metadata(batch), device, rep_ms=max(rep_ms // 4, 1)
    )
    backend.init_forward_metadata(batch)
    out = backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False)
    us = median_us(
        lambda: backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False),
        device,
        rep_ms=rep_ms,
    )
    return us, init_us, out.float()


def points(quick: bool, smoke: bool, key_shapes: bool) -> list[Point]:
    if smoke:
        shapes, decodes = [(1, 40, 4), (2, 40, 4), (2, 70, 40)], [(2, 40)]
    elif key_shapes:
        shapes = [(32, 4096, 8), (32, 4096, 64), (64, 16384, 8)]
        decodes = [(32, 4096), (64, 16384)]
    else:
        sizes = [1, 32] if quick else [1, 8, 32, 64]
        prefixes = [4096] if quick else [1024, 4096, 16384]
        widths = [8] if quick else [8, 64]
        shapes = [(bs, p, n) for p in prefixes for bs in sizes for n in widths]
        decodes = [(bs, p) for p in prefixes for bs in sizes]
    rows = []
    for bs, prefix, n in shapes:
        rows.append(Point(ForwardMode.EXTEND, bs, prefix, n))
        rows.append(Point(ForwardMode.TARGET_VERIFY, bs, prefix, n))
    rows += [Point(ForwardMode.DECODE, bs, prefix, 1) for bs, prefix in decodes]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bs 1 and 32, prefix 4k, N 8 only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument(
        "--key-shapes",
        action="store_true",
        help="only bs 32 prefix 4k N 8 and 64, bs 64 prefix 16k N 8, and decode",
    )
    parser.add_argument("--tune", action="store_true", help="also sweep Triton tile options")
    parser.add_argument(
        "--tune-prefix",
        nargs="+",
        type=int,
        default=[4096],
        metavar="KEYS",
        help="prefixes of the --tune sweeps (default 4096)",
    )
    parser.add_argument(
        "--tune-widths",
        nargs="+",
        type=int,
        default=[8, 64],
        choices=[8, 64],
        metavar="N",
        help="tree widths of the --tune sweeps: 8 (tiles, then splits) and/or 64 (wide tiles)",
    )
    parser.add_argument(
        "--min-chunk-sweep",
        action="store_true",
        help="only the split-size sweep of short prefixes (decode and N = 8 verify)",
    )
    parser.add_argument(
        "--split-sweep",
        action="store_true",
        help="only the split-target sweep (programs per SM; decode and N = 8 verify, bs 1-64)",
    )
    parser.add_argument("--backends", help="comma-separated (default torch,triton,flash)")
    parser.add_argument("--rep-ms", type=int, default=60)
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = (args.backends or "torch,triton,flash").split(",")
    # in bytes/s, the unit of the KV bandwidth; 64 KiB on the CPU keeps the smoke run short
    copy_bw = copy_bandwidth_gbs(device, (1 << 30) if device.type == "cuda" else (1 << 16)) * 1e9
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [
        f"device: {device_name}; torch {torch.__version__}, triton {triton.__version__}; "
        f"copy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s",
        "",
        "| mode | bs | prefix | new | backend | time µs | init µs | KV GB/s | % copy "
        "| verify/extend | err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    extend_us: dict[tuple[int, int, int, str], float] = {}
    sweep_only = args.min_chunk_sweep or args.split_sweep
    for point in [] if sweep_only else points(args.quick, args.smoke, args.key_shapes):
        setup = make_setup(point, device)
        results: dict[str, tuple[float, float, torch.Tensor]] = {}  # µs, init µs, output
        for name, backend in build_backends(setup, names, {}).items():
            results[name] = measure(setup, backend, device, args.rep_ms)
        anchor = results["triton"][2] if "triton" in results else None
        for name, (us, init_us, out) in results.items():
            bandwidth = setup.kv_bytes / (us * 1e-6)
            key = (point.bs, point.prefix, point.new, name)
            ratio = ""
            if point.mode is ForwardMode.EXTEND:
                extend_us[key] = us
            elif point.mode is ForwardMode.TARGET_VERIFY and key in extend_us:
                ratio = f"{us / extend_us[key]:.2f}"
            err = f"{(out - anchor).abs().max().item():.1e}" if anchor is not None else ""
            line = (
                f"| {point.mode.name.lower()} | {point.bs} | {point.prefix} | {point.new} | {name} "
                f"| {us:.1f} | {init_us:.1f} | {bandwidth / 1e9:.0f} "
                f"| {100 * bandwidth / copy_bw:.0f} | {ratio} | {err} |"
            )
            lines.append(line)
            print(line, flush=True)
        del setup, results
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.tune:
        for prefix in args.tune_prefix:
            lines += tune(device, copy_bw, args.rep_ms, args.smoke, prefix, tuple(args.tune_widths))
    if sweep_only:
        sweeps = []
        if args.min_chunk_sweep:
            sweeps += min_chunk_sweep(device, args.rep_ms, args.smoke)
        if args.split_sweep:
            sweeps += split_sweep(device, args.rep_ms, args.smoke)
        lines = [lines[0], *sweeps]
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
