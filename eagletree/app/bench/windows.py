"""Application: the decode windows of `eagletree bench`, one row per engine and cell (a batch
size at a temperature).

A row is several windows, each a draw of prompts decoded ``new_tokens`` tokens a request
(``windows_per_row``). Engines measured in turn each run their own windows, minutes apart;
with ``--interleave`` every engine of the run is held at once and each draw is decoded by every
engine before the next draw is, the engines' order turned by one a draw (``turn_order``).
A small model's step is mostly the host's work, and a host that slows down for a few tens of
milliseconds every second or two (on a shared H100 host, steps of 3–5 × the median in runs of
2–13) then weighs on every configuration of a cell alike, instead of on whichever one it met.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from eagletree.app.bench.adaptive_state import last_shape, policy_view, shape_steps

if TYPE_CHECKING:
    from eagletree.app.bench.configs import BenchConfig
    from eagletree.app.bench.lockstep import Lockstep
    from eagletree.app.bench.measure import DecodeMeasurement
    from eagletree.app.bench.plan import BenchPlan
    from eagletree.app.bench.prompts import BenchPrompts
    from eagletree.app.bench.rows import BenchRow
    from eagletree.app.engine.loop import Engine


@dataclass(frozen=True, slots=True)
class BenchEngine:
    """An engine under measurement: its configuration, this rank's data-parallel replica and
    how the replicas step."""

    engine: Engine
    config: BenchConfig
    replica: int
    lockstep: Lockstep


def measure_windows(
    engines: Sequence[BenchEngine],
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    prompts: BenchPrompts,
) -> list[BenchRow]:
    """Every engine's rows at every temperature and batch size, grouped by engine in the order
    given; several engines are measured interleaved, cell by cell."""
    rows: list[list[BenchRow]] = [[] for _ in engines]
    for temperature in args.temperatures:
        for bs in args.batch_sizes:
            cell = _measure_cell(engines, temperature, bs, plan, args, err, prompts)
            for own, row in zip(rows, cell, strict=True):
                own.append(row)
    return [row for own in rows for row in own]


def windows_per_row(repeats: int, min_requests: int, batch_size: int) -> int:
    """Windows measured as one row: ``repeats``, or more where fewer would hold under
    ``min_requests`` requests. At bs 1 two windows are two prompts' texts, whose acceptance
    alone moved a row by a fifth on the H200 (an adaptive engine's too: its learning
    is most of so short a row)."""
    return max(repeats, -(-min_requests // batch_size))


def turn_order(num_engines: int, draw: int) -> list[int]:
    """The engines' order for draw number ``draw``: turned by one a draw, so that each runs
    first (after an idle engine's pause, or a slow step of the last) as often as the others."""
    return [(draw + i) % num_engines for i in range(num_engines)]


def _measure_cell(
    engines: Sequence[BenchEngine],
    temperature: float,
    bs: int,
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    prompts: BenchPrompts,
) -> list[BenchRow]:
    """One row per engine at this batch size and temperature; an adaptive engine's row names
    the shape it ran most."""
    from eagletree.app.bench.measure import merged
    from eagletree.app.bench.progress import ProgressBar

    sampled = f" T {temperature:g}" if temperature else ""
    draws = windows_per_row(args.repeats, args.min_requests, bs)
    alone = len(engines) == 1
    name = engines[0].config.name if alone else f"{len(engines)} engines"
    label = f"{name:<20} bs {bs:>3}{sampled}"
    bar = ProgressBar(err, label, len(engines) * draws * args.new_tokens)
    ran_before = [Counter(shape_steps(e.engine)) for e in engines]
    windows: list[list[DecodeMeasurement]] = [[] for _ in engines]
    views: list[list[dict[str, Any]]] = [[] for _ in engines]  # an adaptive engine's, a window each
    for draw in range(draws):
        for turn, i in enumerate(turn_order(len(engines), draw)):
            # each request's tokens, the windows before this one's included
            before = (draw * len(engines) + turn) * args.new_tokens
            progress = partial(_add, before, bar.update)
            window = _window(engines[i], bs, temperature, draw, progress, plan, args, prompts)
            windows[i].append(window)
            view = policy_view(engines[i].engine, bs, temperature)
            if view:
                views[i].append(view)
    merged_rows = [merged(w) for w in windows]
    speeds = [f"{m.tokens_per_s:.1f} tok/s, {m.ms_per_step:.1f} ms/step" for m in merged_rows]
    if alone:
        bar.close(speeds[0])
    else:
        bar.close("interleaved")
        for e, speed in zip(engines, speeds, strict=True):
            print(f"{e.config.name:<20} bs {bs:>3}{sampled}  {speed}", file=err)
    rows = []
    for e, m, before_ran, seen in zip(engines, merged_rows, ran_before, views, strict=True):
        ran = (Counter(shape_steps(e.engine)) - before_ran).most_common()
        row = _row(e.config.name, m, temperature, ran[0][0].label if ran else None)
        ran_steps = {s.label: n for s, n in ran}
        last = seen[-1] if seen else {}
        replaced = dataclasses.replace(
            row, shape_steps=ran_steps, policy_view=last, policy_windows=tuple(seen)
        )
        rows.append(replaced)
    return rows


def _window(
    e: BenchEngine,
    bs: int,
    temperature: float,
    draw: int,
    on_tokens: Callable[[int], None],
    plan: BenchPlan,
    args: argparse.Namespace,
    prompts: BenchPrompts,
) -> DecodeMeasurement:
    """One engine's window over draw number ``draw`` of ``bs`` prompts (this replica's share);
    the first draw is profiled (and traced)."""
    from eagletree.app.bench.measure import measure_decode
    from eagletree.app.parallel.router import route_by_load

    batch = prompts.batch(bs, e.engine.vocab_size, draw)
    # the router's placement of the batch over idle replicas, the same on every rank
    placement = route_by_load([len(p) for p in batch], [0] * e.lockstep.size)
    first = draw == 0
    return measure_decode(
        e.engine,
        [prompt for prompt, r in zip(batch, placement, strict=True) if r == e.replica],
        new_tokens=args.new_tokens,
        max_tokens_per_step=e.config.max_tokens_per_step,
        warmup_steps=args.warmup_steps,
        profile_steps=args.profile_steps if first else 0,
        cuda=plan.cuda,
        on_tokens=on_tokens,
        lockstep=e.lockstep,
        trace=_trace_path(args.trace, e.config.name, bs) if e.replica == 0 and first else None,
        temperature=temperature,
        # only an adaptive engine's steps differ in shape: no other engine's timed loop pays
        # the lookup
        launched=partial(last_shape, e.engine) if e.config.adaptive else None,
    )


def _add(base: int, update: Callable[[int], None], done: int) -> None:
    update(base + done)


def _trace_path(directory: Path | None, config: str, batch_size: int) -> Path | None:
    """``DIR/<config>-bs<N>.json`` for a row's Chrome trace, or None without ``--trace``."""
    if directory is None:
        return None
    name = "-".join(config.replace(",", " ").split())
    return directory / f"{name}-bs{batch_size}.json"


def _row(
    config: str, m: DecodeMeasurement, temperature: float = 0.0, chosen: str | None = None
) -> BenchRow:
    from eagletree.app.bench.rows import BenchRow

    profile = m.profile
    return BenchRow(
        config=config,
        batch_size=m.batch_size,
        temperature=temperature,
        chosen=chosen,
        tokens_per_s=m.tokens_per_s,
        ms_per_step=m.ms_per_step,
        tokens_per_step=m.tokens_per_step,
        launches_per_step=None if profile is None else profile.launches_per_step,
        device_ms_per_step=None if profile is None else profile.device_ms_per_step,
        profiled_ms_per_step=None if profile is None else profile.wall_ms_per_step,
        top_kernels=() if profile is None else profile.top_kernels,
        gaps=None if profile is None else profile.gaps,
        num_steps=m.num_steps,
        num_tokens=m.num_tokens,
        replica_batch_sizes=m.replica_batch_sizes if len(m.replica_batch_sizes) > 1 else (),
        num_ended_early=m.num_ended_early,
        ended_early_reason=m.ended_early_reason,
        step_ms=tuple(1000.0 * t for t in m.step_seconds),
        step_shapes=m.step_shapes,
        step_tokens=m.step_tokens,
        window_tokens_per_s=m.window_tokens_per_s,
    )
