"""Benchmark: Triton attention's launch options on Llama-3.1-8B shapes, one layer replayed from a
CUDA graph as the engine's captured steps run it — tile options and split counts (``attention
--tune``), the split size of short prefixes (``--min-chunk-sweep``) and the split target in
programs per SM (``--split-sweep``). A kernel of a few µs timed eagerly would measure its launch.
"""

from __future__ import annotations

import torch

from benchmarks.attention_setup import KV_HEADS, Point, Setup, build_backends, make_setup
from benchmarks.timing import replay_us
from eagletree.domain.batch import ForwardMode
from eagletree.ports.attention import AttentionBackend

# Triton options swept at bs 32, prefix 4k. N = 8 (32-row tiles): block_n, num_stages,
# num_warps, max_registers (0: no cap); then split counts (target programs per SM) at the best
# tile. N = 64 (256 rows per request): block_m first. The first row of each list is the default.
TILE_KEYS = ("block_n", "num_stages", "num_warps", "max_registers")
TUNE_TILES = [
    (32, 3, 4, 128),
    (32, 2, 4, 128),
    (32, 4, 4, 128),
    (32, 3, 4, 0),
    (32, 3, 8, 0),
    (16, 3, 4, 128),
    (64, 2, 4, 128),
    (64, 3, 4, 128),
    (64, 2, 4, 0),
    (64, 3, 4, 0),
    (64, 2, 8, 0),
    (128, 2, 4, 0),
]
TUNE_PROGRAMS_PER_SM = [2, 3, 4, 6, 8]
TUNE_WIDE = [
    (256, 32, 3, 16, 128),
    (256, 32, 2, 16, 128),
    (256, 32, 3, 16, 0),
    (64, 32, 3, 4, 0),
    (64, 32, 2, 4, 0),
    (64, 64, 2, 4, 0),
    (64, 32, 3, 4, 168),
    (64, 64, 3, 8, 0),
    (128, 32, 3, 8, 128),
    (128, 32, 3, 8, 0),
    (128, 64, 2, 8, 0),
    (128, 64, 3, 8, 0),
    (32, 32, 3, 4, 128),
]


def tune(
    device: torch.device,
    copy_bw: float,
    rep_ms: int,
    smoke: bool,
    prefix: int = 4096,
    widths: tuple[int, ...] = (8, 64),
) -> list[str]:
    """Verify and extend times per Triton option set (replayed from a CUDA graph, as the
    engine's captured steps run them) at bs 32 over ``prefix`` keys; the best verify of each
    sweep last."""
    bs, prefix = (2, 40) if smoke else (32, prefix)
    lines = [
        "",
        f"| N (bs {bs}, prefix {prefix}) | triton options | verify µs | extend µs "
        "| verify % copy | verify/extend |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    sms = (
        1
        if device.type == "cpu"
        else torch.cuda.get_device_properties(device).multi_processor_count
    )
    limit = 2 if smoke else None  # the interpreter ignores most options: two rows show it runs
    best: dict[str, tuple[float, dict[str, int]]] = {}

    def row(sweep: str, n: int, options: dict[str, int], setups: dict[ForwardMode, Setup]) -> None:
        times = {}
        for mode, setup in setups.items():
            backend = build_backends(setup, ["triton"], options)["triton"]
            times[mode] = replayed_us(setup, backend, device, rep_ms)
        verify, extend = times[ForwardMode.TARGET_VERIFY], times[ForwardMode.EXTEND]
        pct = 100 * setups[ForwardMode.TARGET_VERIFY].kv_bytes / (verify * 1e-6) / copy_bw
        label = " ".join(f"{key}={value}" for key, value in options.items())
        line = (
            f"| {n} | {label} | {verify:.1f} | {extend:.1f} | {pct:.0f} | {verify / extend:.2f} |"
        )
        lines.append(line)
        print(line, flush=True)
        if verify < best.get(sweep, (float("inf"), {}))[0]:
            best[sweep] = (verify, options)

    for n in widths:
        setups = {
            mode: make_setup(Point(mode, bs, prefix, n), device)
            for mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)
        }
        if n == 8:
            for tile in TUNE_TILES[:limit]:
                row("N=8 tiles", n, dict(zip(TILE_KEYS, tile, strict=True)), setups)
            for per_sm in TUNE_PROGRAMS_PER_SM[:limit]:
                options = best["N=8 tiles"][1] | {"target_programs": per_sm * sms}
                row("N=8 splits", n, options, setups)
        else:
            for wide in TUNE_WIDE[:limit]:
                row("N=64", n, dict(zip(("block_m", *TILE_KEYS), wide, strict=True)), setups)
        del setups
        if device.type == "cuda":
            torch.cuda.empty_cache()
    summary = [f"best verify, {sweep}: {us:.1f} µs with {o}" for sweep, (us, o) in best.items()]
    print("\n".join(summary), flush=True)
    return [*lines, "", *summary]


def replayed_us(
    setup: Setup, backend: AttentionBackend, device: torch.device, rep_ms: int
) -> float:
    """Median µs of one layer's attention (and split merge) replayed from a CUDA graph."""
    batch, q, layer = setup.batch, setup.q, setup.layer
    backend.init_forward_metadata(batch)

    def forward() -> object:
        return backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False)

    return replay_us([forward], device, rep_ms=rep_ms)


MIN_CHUNKS = (32, 64, 128, 256)  # the first (one key block) is the backend's default
PROGRAMS_PER_SM = (1, 2, 3, 4)  # the split count aims at this many programs per SM; default 4


def min_chunk_sweep(device: torch.device, rep_ms: int, smoke: bool) -> list[str]:
    """Attention (and merge) time of one layer per ``min_chunk``, replayed from a CUDA graph,
    for the short prefixes where it decides the split count: decode and N = 8 verify at
    bs 1, 8, 32."""
    chunks = MIN_CHUNKS[:2] if smoke else MIN_CHUNKS  # the interpreter is slow: two show it runs
    sizes, prefixes = ((1, 2), (40,)) if smoke else ((1, 8, 32), (256, 1024))
    options = [{"min_chunk": chunk} for chunk in chunks]
    return option_sweep(
        device, rep_ms, sizes, prefixes, options, [f"min_chunk {c}" for c in chunks]
    )


def split_sweep(device: torch.device, rep_ms: int, smoke: bool) -> list[str]:
    """Attention (and merge) time of one layer per split target (programs per SM), replayed
    from a CUDA graph: decode and N = 8 verify at bs 1–64 over prefixes 256 to 16k."""
    per_sm = PROGRAMS_PER_SM[:2] if smoke else PROGRAMS_PER_SM
    sms = (
        1
        if device.type == "cpu"
        else torch.cuda.get_device_properties(device).multi_processor_count
    )
    sizes, prefixes = ((1, 2), (40,)) if smoke else ((1, 8, 32, 64), (256, 1024, 4096, 16384))
    options = [{"target_programs": p * sms} for p in per_sm]
    return option_sweep(device, rep_ms, sizes, prefixes, options, [f"{p}/SM" for p in per_sm])


def option_sweep(
    device: torch.device,
    rep_ms: int,
    sizes: tuple[int, ...],
    prefixes: tuple[int, ...],
    options: list[dict[str, int]],
    labels: list[str],
) -> list[str]:
    """One row per (mode, prefix, bs): the replayed µs of each option set, and the best."""
    lines = [
        "",
        "| mode | bs | prefix | " + " | ".join(f"{label} µs" for label in labels) + " | best |",
        "|---|---|---|" + "---|" * (len(labels) + 1),
    ]
    print("\n".join(lines), flush=True)
    for mode, new in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, 8)):
        for prefix in prefixes:
            for bs in sizes:
                setup = make_setup(Point(mode, bs, prefix, new), device)
                times = []
                for option in options:
                    backend = build_backends(setup, ["triton"], option)["triton"]
                    times.append(replayed_us(setup, backend, device, rep_ms))
                best = labels[times.index(min(times))]
                cells = " | ".join(f"{t:.1f}" for t in times)
                line = f"| {mode.name.lower()} | {bs} | {prefix} | {cells} | {best} |"
                lines.append(line)
                print(line, flush=True)
                del setup
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return lines
