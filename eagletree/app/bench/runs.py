"""Application: the measurements of one `eagletree bench` run — one engine per configuration,
built in turn (and freed before the next), its first request timed cold and warm, measured at
every batch size, or under arrivals, and transformers' ``generate`` on the plain
configuration's checkpoint if asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from eagletree.app.bench.adaptive_state import (
    adaptive_state,
    last_shape,
    policy_view,
    shape_steps,
)
from eagletree.app.parallel.launch import with_parallel

if TYPE_CHECKING:
    from eagletree.app.bench.arrivals import ArrivalsMeasurement
    from eagletree.app.bench.configs import BenchConfig
    from eagletree.app.bench.lockstep import Lockstep
    from eagletree.app.bench.measure import DecodeMeasurement
    from eagletree.app.bench.plan import BenchPlan
    from eagletree.app.bench.prompts import BenchPrompts
    from eagletree.app.bench.report import ArrivalRow, BenchRow, FirstRequestRow, HFRow
    from eagletree.app.engine.loop import Engine
    from eagletree.config.settings import EngineSettings


class Measurements(NamedTuple):
    """What one run measured, and the settings each configuration ran."""

    rows: list[BenchRow]  # with their break-even τ and ÷ plain
    arrival_rows: list[ArrivalRow]
    hf_rows: list[HFRow]
    first_requests: list[FirstRequestRow]
    engines: dict[str, Any]
    # per adaptive engine, after its windows: its step costs, measured and as learned, and
    # the rank profiles it learned per band (what benchmarks/projected.py reads)
    adaptive: dict[str, Any]


def measure_all(
    plan: BenchPlan, configs: Sequence[BenchConfig], args: argparse.Namespace, err: TextIO
) -> Measurements:
    """Every configuration's engine, built in turn: its first request cold and warm, then
    every batch size and temperature (or arrivals), with transformers' generate beside the
    plain one if asked."""
    from eagletree.app.bench.plan import settings_for
    from eagletree.app.bench.prompts import bench_prompts
    from eagletree.app.bench.report import with_break_even

    # before any engine is built: a bad --prompts file ends the run at once
    prompts = bench_prompts(args, plan.target, lambda message: print(message, file=err))
    rows: list[BenchRow] = []
    arrival_rows: list[ArrivalRow] = []
    hf_rows: list[HFRow] = []
    first_requests: list[FirstRequestRow] = []
    used: dict[str, Any] = {}
    adaptive: dict[str, Any] = {}
    for config in configs:
        settings = settings_for(plan, config)
        tp_size, dp_size = (size if size > 1 else None for size in (args.tp, args.dp))
        settings = with_parallel(settings, tp_size, dp_size)  # a flag at 1 keeps the file's size
        engine, replica, lockstep, used[config.name] = _build(settings, err)
        # random weights: an EOS token would end a request at a random step
        engine.eos_token_ids = frozenset()
        first_requests.append(_first_request(engine, config, prompts, args, plan, err, lockstep))
        if args.arrivals is not None:
            arrival_rows += _measure_arrivals(engine, config, plan, args, err, prompts)
        else:
            rows += _measure_windows(engine, config, plan, args, err, replica, lockstep, prompts)
        if args.hf and not config.speculative:
            hf_rows = _measure_hf(plan, engine, args, err, prompts)
        learned = adaptive_state(engine)
        if learned is not None:
            adaptive[config.name] = learned
        del engine
        _release_memory(plan.cuda)
    return Measurements(
        with_break_even(rows), arrival_rows, hf_rows, first_requests, used, adaptive
    )


def _first_request(
    engine: Engine,
    config: BenchConfig,
    prompts: BenchPrompts,
    args: argparse.Namespace,
    plan: BenchPlan,
    err: TextIO,
    lockstep: Lockstep,
) -> FirstRequestRow:
    """The engine's first request (the first prompt of batch size 1), then the same again."""
    from eagletree.app.bench.latency import first_request_seconds
    from eagletree.app.bench.report import FirstRequestRow

    prompt = prompts.batch(1, engine.vocab_size)[0]
    cold, warm = first_request_seconds(engine, prompt, args.new_tokens, plan.cuda, lockstep)
    print(
        f"{config.name:<20} first request {1000 * cold:.1f} ms, again {1000 * warm:.1f} ms",
        file=err,
    )
    return FirstRequestRow(config.name, 1000.0 * cold, 1000.0 * warm)


def _measure_windows(
    engine: Engine,
    config: BenchConfig,
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    replica: int,
    lockstep: Lockstep,
    prompts: BenchPrompts,
) -> list[BenchRow]:
    """One engine's decode windows at every temperature and batch size; an adaptive engine's
    rows name the shape it ran most in each window."""
    from eagletree.app.bench.measure import measure_decode, merged
    from eagletree.app.bench.progress import ProgressBar
    from eagletree.app.parallel.router import route_by_load

    rows = []
    for temperature in args.temperatures:
        for bs in args.batch_sizes:
            sampled = f" T {temperature:g}" if temperature else ""
            draws = windows_per_row(args.repeats, args.min_requests, bs)
            label = f"{config.name:<20} bs {bs:>3}{sampled}"
            bar = ProgressBar(err, label, draws * args.new_tokens)
            chosen = shape_steps(engine)
            chosen_before = Counter(chosen)
            windows = []
            for draw in range(draws):
                batch = prompts.batch(bs, engine.vocab_size, draw)
                # the router's placement of the batch over idle replicas, the same on every rank
                placement = route_by_load([len(p) for p in batch], [0] * lockstep.size)
                first = draw == 0
                windows.append(
                    measure_decode(
                        engine,
                        [
                            prompt
                            for prompt, r in zip(batch, placement, strict=True)
                            if r == replica
                        ],
                        new_tokens=args.new_tokens,
                        max_tokens_per_step=config.max_tokens_per_step,
                        warmup_steps=args.warmup_steps,
                        profile_steps=args.profile_steps if first else 0,
                        cuda=plan.cuda,
                        # each request's tokens, the windows before this one's included
                        on_tokens=partial(_add, draw * args.new_tokens, bar.update),
                        lockstep=lockstep,
                        trace=_trace_path(args.trace, config.name, bs)
                        if replica == 0 and first
                        else None,
                        temperature=temperature,
                        # only an adaptive engine's steps differ in shape: no other engine's
                        # timed loop pays the lookup
                        launched=partial(last_shape, engine) if config.adaptive else None,
                    )
                )
            m = merged(windows)
            bar.close(f"{m.tokens_per_s:.1f} tok/s, {m.ms_per_step:.1f} ms/step")
            ran = (Counter(chosen) - chosen_before).most_common()
            row = _row(config.name, m, temperature, ran[0][0].label if ran else None)
            ran_steps = {s.label: n for s, n in ran}
            view = policy_view(engine, bs, temperature)
            rows.append(dataclasses.replace(row, shape_steps=ran_steps, policy_view=view))
    return rows


def _add(base: int, update: Callable[[int], None], done: int) -> None:
    update(base + done)


def windows_per_row(repeats: int, min_requests: int, batch_size: int) -> int:
    """Windows measured as one row: ``repeats``, or more where fewer would hold under
    ``min_requests`` requests. At bs 1 two windows are two prompts' texts, whose acceptance
    alone moved a row by a fifth on the H200 (an adaptive engine's too: its learning
    is most of so short a row)."""
    return max(repeats, -(-min_requests // batch_size))


def _trace_path(directory: Path | None, config: str, batch_size: int) -> Path | None:
    """``DIR/<config>-bs<N>.json`` for a row's Chrome trace, or None without ``--trace``."""
    if directory is None:
        return None
    name = "-".join(config.replace(",", " ").split())
    return directory / f"{name}-bs{batch_size}.json"


def _measure_arrivals(
    engine: Engine,
    config: BenchConfig,
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    prompts: BenchPrompts,
) -> list[ArrivalRow]:
    """The arrivals rows of one engine: every batch size, under every ``--prefill-step``
    (switched on its scheduler, so that both run on the same engine and graphs)."""
    from eagletree.app.bench.arrivals import measure_arrivals
    from eagletree.app.bench.progress import ProgressBar

    rows = []
    for bs in args.batch_sizes:
        batch = prompts.batch(bs + args.num_arrivals, engine.vocab_size)
        for prefill_step in args.prefill_step or [plan.base.scheduler.prefill_step]:
            engine.scheduler.prefill_step = prefill_step
            label = f"{config.name:<20} bs {bs:>3} {prefill_step:<11}"
            bar = ProgressBar(err, label, args.num_arrivals, unit="arrivals")
            m = measure_arrivals(
                engine,
                batch[:bs],
                batch[bs:],
                every=args.arrivals,
                new_tokens=args.new_tokens,
                max_tokens_per_step=config.max_tokens_per_step,
                warmup_steps=args.warmup_steps,
                cuda=plan.cuda,
                on_arrivals=bar.update,
            )
            bar.close(
                f"{m.tokens_per_s:.1f} tok/s, TTFT {1000 * m.mean_time_to_first_token_s:.1f} ms"
            )
            rows.append(_arrival_row(config.name, prefill_step, m))
    return rows


def _arrival_row(config: str, prefill_step: str, m: ArrivalsMeasurement) -> ArrivalRow:
    from eagletree.app.bench.report import ArrivalRow

    return ArrivalRow(
        config=config,
        prefill_step=prefill_step,
        batch_size=m.batch_size,
        arrival_every=m.arrival_every,
        num_arrivals=m.num_arrivals,
        tokens_per_s=m.tokens_per_s,
        mean_ttft_ms=1000.0 * m.mean_time_to_first_token_s,
        num_steps=m.num_steps,
        num_tokens=m.num_tokens,
        num_arrival_tokens=m.num_arrival_tokens,
        num_prefill_only_steps=m.num_prefill_only_steps,
        ttft_ms=tuple(1000.0 * t for t in m.time_to_first_token_s),
    )


def _build(settings: EngineSettings, err: TextIO) -> tuple[Engine, int, Lockstep, dict[str, Any]]:
    """This rank's engine of ``settings``, its data-parallel replica, how it steps, and the
    settings it runs with CUDA graphs, overlap and a chain's drafts for sampling requests as
    resolved for it (not "auto")."""
    from eagletree.app.bench.lockstep import ALONE, Lockstep
    from eagletree.app.composition.container import build_engine_container
    from eagletree.app.parallel.data_parallel import DataParallelEngine

    def progress(line: str) -> None:
        print(line, file=err)

    container = build_engine_container(settings, progress=progress)
    replica, lockstep = 0, ALONE
    if settings.parallel.dp_size > 1:  # as build_data_parallel_engine, keeping the container
        groups = container.parallel_groups()  # every group made before any model needs one
        engine = DataParallelEngine(container.engine(), groups).engine
        replica = groups.dp_rank
        lockstep = Lockstep(groups.dp_group, groups.dp_size, replica)
    else:
        engine = container.engine()
    resolved = container.settings().model_dump()  # the container's: "auto" device values gone
    resolved["backend"]["cuda_graph"] = "on" if container.cuda_graphs().enabled else "off"
    resolved["scheduler"]["overlap"] = "on" if container.overlap() else "off"
    draws = container.speculative().draw_drafts
    resolved["speculative"]["sampled_drafts"] = "drawn" if draws else "top_k"
    return engine, replica, lockstep, resolved


def _row(
    config: str, m: DecodeMeasurement, temperature: float = 0.0, chosen: str | None = None
) -> BenchRow:
    from eagletree.app.bench.report import BenchRow

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
    )


def _measure_hf(
    plan: BenchPlan, engine: Engine, args: argparse.Namespace, err: TextIO, prompts: BenchPrompts
) -> list[HFRow]:
    from eagletree.app.bench.hf_compare import load_hf_model, measure_hf
    from eagletree.app.composition.factories import torch_dtype

    model = load_hf_model(plan.target, torch_dtype(plan.base.model.dtype), plan.base.model.device)
    rows = []
    for bs in sorted({1, *args.batch_sizes}):
        batch = prompts.batch(bs, engine.vocab_size)
        reference = [r.output_ids for r in engine.generate(batch, args.new_tokens)]
        row = measure_hf(model, batch, args.new_tokens, reference, plan.cuda)
        print(
            f"{'transformers':<20} bs {bs:>3}: {row.tokens_per_s:.1f} tok/s, "
            f"{row.matching_share:.0%} of the engine's plain tokens",
            file=err,
        )
        rows.append(row)
    del model
    _release_memory(plan.cuda)
    return rows


def _release_memory(cuda: bool) -> None:
    import torch

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
