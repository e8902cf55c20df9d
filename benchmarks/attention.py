"""Benchmark: attention backends on Llama-3.1-8B shapes — time and KV bandwidth against a copy.

One layer of 32 q heads, 8 kv heads, head_dim 128, bf16, prefixes on randomly scattered slots.
Rows: target verify (a random draft tree of N nodes, FULL_MASK) for bs in {1, 8, 32, 64},
prefix in {1k, 4k, 16k}, N in {8, 64}; the causal EXTEND of the same shape (N new tokens per
request on the same prefix), whose time is the denominator of the tree-mask overhead ratio; and
decode (one token per request). KV bytes = bs · (prefix + new) · kv_heads · (head_dim +
v_head_dim) · 2 B read once; bandwidth = KV bytes / median time, shown as a share of the
device-to-device copy bandwidth (bytes read + written) measured in the same run. Times are
medians of ``triton.testing.do_bench`` (L2 flushed) of ``forward(save_kv=False)`` after one
``init_forward_metadata``, whose own time (once per forward, shared by all layers) is ``init``;
``err`` is the max |o − o_triton| of the row's output.

``--min-chunk-sweep`` measures only the split sizes of short prefixes (``min_chunk`` 32 … 256
keys per split) for decode and N = 8 verify at bs 1, 8, 32, prefixes 256 and 1k.
``--split-sweep`` measures the split target (programs per SM: 1–4) for decode and N = 8 verify
at bs 1–64 over prefixes 256 to 16k.
``--compare`` runs issue 4's shapes (bs 32 prefix 4k N 8 and 64, bs 64 prefix 16k N 8, decode)
for ``triton-base`` (the Triton path before the rework, ``attention_baseline.py``), ``triton``
and ``flash``. ``--tune`` sweeps Triton tile options and split counts at bs 32, prefix 4k for
N = 8 and N = 64 (``--tune-prefix`` for other prefixes) and prints the best of each sweep.

    PYTHONPATH=$PWD python3 benchmarks/attention.py --out attention.md     # full table, H200
    PYTHONPATH=$PWD python3 benchmarks/attention.py --compare --tune --out attention.md
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/attention.py --smoke --compare --tune
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from benchmarks.attention_baseline import BaselineTritonAttentionBackend
from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.domain.attention_layer import AttentionLayer
from eagletree.domain.batch import ForwardBatch, ForwardMode, TargetVerifySpec
from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.ports.attention import AttentionBackend

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
TREE_SHAPE = {8: (4, 5), 64: (8, 5)}  # N -> (topk, num_steps), typical tree configs
TORCH_SCORE_BUDGET = 2 << 30  # skip the dense reference when its fp32 scores exceed this


@dataclass(frozen=True)
class Point:
    mode: ForwardMode
    bs: int
    prefix: int
    new: int  # new tokens per request


@dataclass
class Setup:
    pool: MHAKVPool
    table: TensorReqToTokenPool
    batch: ForwardBatch
    q: torch.Tensor
    layer: AttentionLayer

    @property
    def kv_bytes(self) -> int:
        keys = int(self.batch.seq_lens_sum or 0) + self.batch.num_tokens
        return keys * KV_HEADS * (HEAD_DIM + HEAD_DIM) * 2


def random_tree_spec(
    bs: int, n: int, prefix: int, device: torch.device, gen: torch.Generator
) -> tuple[TargetVerifySpec, torch.Tensor]:
    topk, steps = TREE_SHAPE.get(n, (2, max(1, n - 1)))
    hidden = torch.zeros(bs, 1, device=device)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for step in range(steps):
        rows = bs if step == 0 else bs * topk
        probs = torch.rand(rows, topk, generator=gen).to(device) + 1e-3
        probs = torch.sort(probs / probs.sum(-1, keepdim=True), -1, descending=True).values
        tokens = torch.randint(0, 32000, (rows, topk), generator=gen).to(device)
        beam = select_top_k_tokens(step, probs, tokens, hidden, scores, topk)
        hidden, scores = beam.hidden_states, beam.scores
        score_list.append(beam.tree_info[0])
        token_list.append(beam.tree_info[1])
        parents_list.append(beam.tree_info[2])
    parent_list, top_index, draft = organize_draft_results(score_list, token_list, parents_list, n)
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64, device=device)
    roots = torch.zeros(bs, dtype=torch.int64, device=device)
    tree = build_tree(
        roots,
        parent_list,
        top_index,
        draft,
        seq_lens,
        topk,
        steps,
        n,
        TreeMaskMode.FULL_MASK,
        seq_lens_sum=bs * prefix,
    )
    block = torch.full((bs,), n * (prefix + n), dtype=torch.int64, device=device)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), block.cumsum(0)])
    return TargetVerifySpec(n, tree.tree_mask, TreeMaskMode.FULL_MASK, indptr), tree.positions


def make_setup(point: Point, device: torch.device, seed: int = 0) -> Setup:
    gen = torch.Generator().manual_seed(seed)
    bs, prefix, new = point.bs, point.prefix, point.new
    num_tokens = bs * new
    size = bs * (prefix + new) + 1
    pool = MHAKVPool(size, 1, KV_HEADS, HEAD_DIM, HEAD_DIM, torch.bfloat16, device, TorchRowMover())
    for buf in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
        buf.normal_()  # random rows, never zeros
    slots = torch.randperm(size, device=device) + 1  # scattered, as a long-lived allocator leaves
    table = TensorReqToTokenPool(bs, prefix + new + 8, device)
    prefix_slots = slots[: bs * prefix].view(bs, prefix)
    table.req_to_token[:, :prefix] = prefix_slots.to(torch.int32)
    out_cache_loc = slots[bs * prefix : bs * prefix + num_tokens]
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64, device=device)
    positions = (torch.arange(new, device=device) + prefix).repeat(bs)
    extend_lens = None
    spec = None
    if point.mode is ForwardMode.TARGET_VERIFY:
        spec, positions = random_tree_spec(bs, new, prefix, device, gen)
    elif point.mode is ForwardMode.EXTEND:
        extend_lens = torch.full((bs,), new, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        mode=point.mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions,
        seq_lens=seq_lens,
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
        out_cache_loc=out_cache_loc,
        extend_lens=extend_lens,
        seq_lens_cpu=torch.full((bs,), prefix, dtype=torch.int64),
        seq_lens_sum=bs * prefix,
        extend_lens_cpu=None if extend_lens is None else torch.full((bs,), new),
        spec=spec,
    )
    q = torch.randn(num_tokens, Q_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
    layer = AttentionLayer(0, Q_HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, 1.0 / math.sqrt(HEAD_DIM))
    return Setup(pool, table, batch, q, layer)


def median_ms(fn: Callable[[], object], device: torch.device, rep_ms: int) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy (64 KiB on CPU)."""
    numel = (1 << 30) // 4 if device.type == "cuda" else 1 << 14
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, 200)
    return 2 * numel * 4 / (ms * 1e-3)


def build_backends(
    setup: Setup, names: list[str], triton_options: dict[str, int]
) -> dict[str, AttentionBackend]:
    backends: dict[str, AttentionBackend] = {}
    for name in names:
        if name == "torch":
            new = setup.batch.num_tokens // max(setup.batch.batch_size, 1)
            prefix = int(setup.batch.seq_lens_sum or 0) // max(setup.batch.batch_size, 1)
            scores = setup.batch.batch_size * Q_HEADS * new * (prefix + new) * 4
            if scores <= TORCH_SCORE_BUDGET:
                backends[name] = TorchAttentionBackend(setup.pool, setup.table)
        elif name == "triton":
            backends[name] = TritonAttentionBackend(setup.pool, setup.table, **triton_options)
        elif name == "triton-base":
            backends[name] = BaselineTritonAttentionBackend(setup.pool, setup.table)
        elif name == "flash" and setup.pool.geometry.device.type == "cuda":
            backends[name] = FlashAttentionBackend(setup.pool, setup.table)
    return backends


def measure(
    setup: Setup, backend: AttentionBackend, device: torch.device, rep_ms: int
) -> tuple[float, float, torch.Tensor]:
    """(forward ms, init_forward_metadata ms, output) of one layer's attention."""
    batch, q, layer = setup.batch, setup.q, setup.layer
    init_ms = median_ms(lambda: backend.init_forward_metadata(batch), device, max(rep_ms // 4, 1))
    backend.init_forward_metadata(batch)
    out = backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False)
    ms = median_ms(
        lambda: backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False),
        device,
        rep_ms,
    )
    return ms, init_ms, out.float()


def points(quick: bool, smoke: bool, compare: bool) -> list[Point]:
    if smoke:
        shapes, decodes = [(1, 40, 4), (2, 40, 4), (2, 70, 40)], [(2, 40)]
    elif compare:  # the shapes issue 4 names, measured before the rework
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
        "--compare",
        action="store_true",
        help="issue 4's shapes; backends triton-base (before the rework), triton, flash",
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
    default = "triton-base,triton,flash" if args.compare else "torch,triton,flash"
    names = (args.backends or default).split(",")
    copy_bw = copy_bandwidth(device)
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
    extend_ms: dict[tuple[int, int, int, str], float] = {}
    sweep_only = args.min_chunk_sweep or args.split_sweep
    for point in [] if sweep_only else points(args.quick, args.smoke, args.compare):
        setup = make_setup(point, device)
        results: dict[str, tuple[float, float, torch.Tensor]] = {}
        for name, backend in build_backends(setup, names, {}).items():
            results[name] = measure(setup, backend, device, args.rep_ms)
        anchor = results["triton"][2] if "triton" in results else None
        for name, (ms, init_ms, out) in results.items():
            bandwidth = setup.kv_bytes / (ms * 1e-3)
            key = (point.bs, point.prefix, point.new, name)
            ratio = ""
            if point.mode is ForwardMode.EXTEND:
                extend_ms[key] = ms
            elif point.mode is ForwardMode.TARGET_VERIFY and key in extend_ms:
                ratio = f"{ms / extend_ms[key]:.2f}"
            err = f"{(out - anchor).abs().max().item():.1e}" if anchor is not None else ""
            line = (
                f"| {point.mode.name.lower()} | {point.bs} | {point.prefix} | {point.new} | {name} "
                f"| {ms * 1e3:.1f} | {init_ms * 1e3:.1f} | {bandwidth / 1e9:.0f} "
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
            times[mode] = replayed_ms(setup, backend, device, rep_ms)
        verify, extend = times[ForwardMode.TARGET_VERIFY], times[ForwardMode.EXTEND]
        pct = 100 * setups[ForwardMode.TARGET_VERIFY].kv_bytes / (verify * 1e-3) / copy_bw
        label = " ".join(f"{key}={value}" for key, value in options.items())
        line = (
            f"| {n} | {label} | {verify * 1e3:.1f} | {extend * 1e3:.1f} | {pct:.0f} "
            f"| {verify / extend:.2f} |"
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
    summary = [
        f"best verify, {sweep}: {ms * 1e3:.1f} µs with {o}" for sweep, (ms, o) in best.items()
    ]
    print("\n".join(summary), flush=True)
    return [*lines, "", *summary]


def replayed_ms(
    setup: Setup, backend: AttentionBackend, device: torch.device, rep_ms: int
) -> float:
    """Median ms of one layer's attention replayed from a CUDA graph: the kernels alone, as the
    engine's captured steps run them (a few-µs kernel timed eagerly measures its launch)."""
    batch, q, layer = setup.batch, setup.q, setup.layer
    backend.init_forward_metadata(batch)

    def forward() -> object:
        return backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False)

    if device.type != "cuda":
        return median_ms(forward, device, rep_ms)
    forward()  # compiles, sizes the scratch buffers
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return median_ms(graph.replay, device, rep_ms)


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
                    times.append(replayed_ms(setup, backend, device, rep_ms) * 1e3)
                best = labels[times.index(min(times))]
                cells = " | ".join(f"{t:.1f}" for t in times)
                line = f"| {mode.name.lower()} | {bs} | {prefix} | {cells} | {best} |"
                lines.append(line)
                print(line, flush=True)
                del setup
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return lines


if __name__ == "__main__":
    main()
