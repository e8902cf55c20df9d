"""Benchmark: KV compaction moves, torch (gather/scatter per buffer) vs the fused Triton mover.

Layouts (``benchmarks/kv_move_workload.py``): Llama-3.1-8B (64 buffers of 2 KiB rows), DeepSeek
MLA (61 buffers of 1152 B rows) and DSA (MLA plus per layer fp8 indexer keys and an fp32 scale:
183 buffers). Moves: bs·(S+1) pairs for bs in {1, 8, 64, 256}, S+1 = 6, plus one 65 536-pair
move, shaped like compaction plans: every request owns a window of N = 16 scattered slots and
moves the nodes of an accepted path (increasing, so targets and sources overlap) to the window's
front. "reversed" is the 65 536-pair move in reverse pair order (its groups no longer start at
multiples of 6, so the hint does not hold).

Columns: "triton" is ``TritonRowMover().move(buffers, tgt, src)`` (no hint: one launch up to 512
pairs, else gather/scatter); "grouped" adds ``independent_groups=6`` — the workers' call, one
launch — shown only where that promise holds. Bytes = 2 x (pairs with tgt != src) x bytes per
slot over all buffers (read + written); self-moves are not counted. "exact" says every mover
timed on that row left the targets equal to the sources gathered before the move and a sample
of the other rows untouched, bit for bit. Three times per mover, from ``benchmarks.timing``,
all medians, the first two with the L2 flushed before each call:

* "µs": ``median_us`` (CUDA events around an eager call). When one call's host work (Python,
  launches) outlasts the 256 MB L2 flush run before it (its time is in the header), the GPU
  idles waiting for the launch and this counts the wait: small moves then measure the host.
* "graph µs": ``replay_us``, the same call captured once in a CUDA graph and replayed: device
  time only (kernels and the gaps between them), what a graph-captured decode step pays.
* "host µs": ``host_us``, CPU time of one eager call (the GPU idle before it): what an eager
  step pays.

The profiler counts kernel launches after every timing of a layout (CUPTI left behind by a
profiler session would otherwise slow the launches that follow).

``--variants all`` (or a comma list of names, see ``TUNING`` in ``kv_move_variants``) adds one
row per (layout, move, variant) with other staging, tile, grid and warp settings.

    PYTHONPATH=$PWD python3 -m benchmarks.kv_move --out kv_move.md [--variants all]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 -m benchmarks.kv_move --smoke --variants all

A baseline is another revision measured in the same device call, not a copy of its kernel. The
benchmark needs only the movers' public API (``TorchRowMover``, ``TritonRowMover`` and the
keywords of ``TUNING``, ``move``, ``check_independent_groups``), so it runs against any arm that
has it:
export the arms with ``bash scripts/ab-arms.sh base=REV new=HEAD`` (carry ``ab``), then run it
once from each arm's directory, where ``python -m`` imports that arm's ``eagletree`` first:

    for arm in base new; do (cd ab/$arm && PYTHONPATH=../..:$PYTHONPATH \
        python3 -m benchmarks.kv_move --out $OUT/kv_move-$arm.md); done
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from benchmarks.kv_move_variants import DEFAULT, TUNING, Variant
from benchmarks.kv_move_workload import (
    STEPS_PLUS_ONE,
    WINDOW,
    hint_holds,
    layout_buffers,
    make_moves,
)
from benchmarks.timing import (
    copy_bandwidth_gbs,
    host_us,
    l2_flush_us,
    launched_kernels,
    median_us,
    replay_us,
)

BATCH_SIZES = (1, 8, 64, 256)
BIG_MOVE = 65_536


def graph_us(call: Callable[[], None], device: torch.device, rep_ms: int) -> float | None:
    """``replay_us`` of the call (None off CUDA, or if capture fails: the reason is printed and
    the eager timings still stand)."""
    if device.type != "cuda":
        return None
    try:
        return replay_us([call], device, rep_ms=rep_ms)
    except RuntimeError as error:
        print(f"graph capture failed: {error}", flush=True)
        return None


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
    graph_us: float | None
    host_us: float | None
    launches: int | None
    exact: bool


class Measured(NamedTuple):
    """One table row's moves: every variant's timings, and its call for the launch count."""

    table: str  # "default" or "tuning"
    layout: str
    label: str
    pairs: int
    mb: float
    timings: dict[str, Timing]
    calls: dict[str, Callable[[], None]]


def time_variants(
    variants: dict[str, Variant],
    buffers: tuple[torch.Tensor, ...],
    tgt: torch.Tensor,
    src: torch.Tensor,
    untouched: torch.Tensor,
    grouped_ok: bool,
    device: torch.device,
    rep_ms: int,
) -> tuple[dict[str, Timing], dict[str, Callable[[], None]]]:
    """Every variant's timings on one move (launches are counted later, see ``run``)."""
    calls: dict[str, Callable[[], None]] = {}
    timings: dict[str, Timing] = {}
    for key, variant in variants.items():
        if variant.grouped and not grouped_ok:
            continue
        mover = variant.make()  # fresh per row: a mover's table cache holds buffers
        hint = STEPS_PLUS_ONE if variant.grouped else None
        call = partial(mover.move, buffers, tgt, src, independent_groups=hint)
        exact = check_exact(call, buffers, tgt, src, untouched)
        t = timings[key] = Timing(
            us=median_us(call, device, rep_ms=rep_ms),
            graph_us=graph_us(call, device, rep_ms),
            # off CUDA the eager time is all host time already
            host_us=host_us(call, device) if device.type == "cuda" else None,
            launches=None,
            exact=exact,
        )
        calls[key] = call
        print(
            f"  {tgt.numel()} pairs, {key}: {t.us:.1f} µs, graph {fmt(t.graph_us)} µs,"
            f" host {fmt(t.host_us)} µs, exact {t.exact}",
            flush=True,
        )
    return timings, calls


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def count(value: int | None) -> str:
    return "—" if value is None else str(value)


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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (
        f"device: {name}; torch {torch.__version__}; copy bandwidth {copy_gbs:.0f} GB/s"
        f" (1 GiB device copy, read + write); the L2 flush before each timed call takes"
        f" {fmt(l2_flush_us(device))} µs"
    )
    tables = {
        "default": [
            "| layout | pairs | MB moved | torch µs | triton µs | triton graph µs | triton % copy"
            " | grouped µs | grouped graph µs | grouped % copy | host µs torch/triton/grouped"
            " | launches torch/triton/grouped | exact |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ],
        "tuning": [
            "| layout | pairs | variant | µs | graph µs | host µs | GB/s | % copy | launches"
            " | exact |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ],
    }
    cases = [(f"bs={bs}", bs * STEPS_PLUS_ONE, "forward") for bs in sizes]
    cases += [(f"{big}", big, "forward"), (f"{big} reversed", big, "reversed")]
    for layout in args.layouts.split(","):
        num_rows = -(-big // STEPS_PLUS_ONE) * WINDOW + 1
        buffers = layout_buffers(layout, num_rows, device, layers)
        slot_bytes = sum(buf[0].numel() * buf.element_size() for buf in buffers)
        measured: list[Measured] = []
        for label, pairs, order in cases:
            print(f"{layout} {label}", flush=True)
            tgt, src = make_moves(order, pairs, num_rows, gen)
            grouped_ok = hint_holds(tgt, src)
            targeted = torch.zeros(num_rows, dtype=torch.bool)
            targeted[tgt] = True
            untouched = (~targeted).nonzero().squeeze(1)[:1024].to(device)
            tgt, src = tgt.to(device), src.to(device)
            moved = int((tgt != src).sum())  # SYNC: benchmark set-up
            mb = 2 * moved * slot_bytes / 1e6
            for table, variants in [("default", DEFAULT), ("tuning", chosen)]:
                timings, calls = time_variants(
                    variants, buffers, tgt, src, untouched, grouped_ok, device, args.rep_ms
                )
                measured.append(Measured(table, layout, label, pairs, mb, timings, calls))
        # Launches are counted after every timing of the layout: a profiler session leaves
        # CUPTI state behind that slows the launches timed after it.
        for row in measured:
            for key, call in row.calls.items():
                launched = launched_kernels(call, device)
                launches = None if launched is None else len(launched)
                row.timings[key] = row.timings[key]._replace(launches=launches)
            tables[row.table] += format_rows(row, copy_gbs)
        del buffers, measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
    lines = [header, "", *tables["default"]]
    if chosen:
        lines += ["", "Variants (one row per mover configuration):", "", *tables["tuning"]]
    return "\n".join(lines)


def format_rows(row: Measured, copy_gbs: float) -> list[str]:
    if row.table == "default":
        return [default_row(row.layout, row.label, row.pairs, row.mb, row.timings, copy_gbs)]
    lines = []
    for key, t in row.timings.items():
        exact = "yes" if t.exact else "NO"
        gbs = row.mb / t.us * 1e3
        lines.append(
            f"| {row.layout} | {row.label} ({row.pairs}) | {key} | {t.us:.1f} "
            f"| {fmt(t.graph_us)} | {fmt(t.host_us)} | {gbs:.0f} "
            f"| {100 * gbs / copy_gbs:.0f} % | {count(t.launches)} | {exact} |"
        )
    return lines


def default_row(
    layout: str, label: str, pairs: int, mb: float, timings: dict[str, Timing], copy_gbs: float
) -> str:
    torch_t, triton_t = timings["torch"], timings["triton"]
    grouped_t = timings.get("grouped")

    def percent(t: Timing | None) -> str:
        return "—" if t is None else f"{100 * mb / t.us * 1e3 / copy_gbs:.0f} %"

    host = "/".join(fmt(t.host_us) if t else "—" for t in (torch_t, triton_t, grouped_t))
    launches = "/".join(count(t.launches) if t else "—" for t in (torch_t, triton_t, grouped_t))
    exact = all(t.exact for t in timings.values())
    return (
        f"| {layout} | {label} ({pairs}) | {mb:.1f} | {torch_t.us:.1f} | {triton_t.us:.1f} "
        f"| {fmt(triton_t.graph_us)} | {percent(triton_t)} "
        f"| {fmt(grouped_t.us) if grouped_t else '—'} "
        f"| {fmt(grouped_t.graph_us) if grouped_t else '—'} | {percent(grouped_t)} "
        f"| {host} | {launches} | {'yes' if exact else 'NO'} |"
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
    parser.add_argument("--rep-ms", type=int, default=200, help="ms per timing")
    args = parser.parse_args()
    table = run(args)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as out:
            out.write(table + "\n")


if __name__ == "__main__":
    main()
