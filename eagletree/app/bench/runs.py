"""Application: the measurements of one `eagletree bench` run — one engine per configuration,
built in turn (and freed before the next; with ``--interleave`` all held until the end), its
first request timed cold and warm, measured at every batch size (``windows``), or under
arrivals, and transformers' ``generate`` on the plain configuration's checkpoint if asked.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from eagletree.app.bench.adaptive_state import adaptive_state
from eagletree.app.parallel.launch import with_parallel

if TYPE_CHECKING:
    from eagletree.app.bench.arrivals import ArrivalsMeasurement
    from eagletree.app.bench.configs import BenchConfig
    from eagletree.app.bench.lockstep import Lockstep
    from eagletree.app.bench.plan import BenchPlan
    from eagletree.app.bench.prompts import BenchPrompts
    from eagletree.app.bench.rows import ArrivalRow, BenchRow, FirstRequestRow, HFRow
    from eagletree.app.bench.windows import BenchEngine
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
    """Every configuration's engine, built in turn (with ``--interleave`` all held at once):
    its first request cold and warm, then every batch size and temperature (or arrivals), with
    transformers' generate beside the plain one if asked."""
    from eagletree.app.bench.prompts import bench_prompts
    from eagletree.app.bench.rows import with_break_even

    # before any engine is built: a bad --prompts file ends the run at once
    prompts = bench_prompts(args, plan.target, lambda message: print(message, file=err))
    m = Measurements([], [], [], [], {}, {})
    for group in [list(configs)] if args.interleave else [[config] for config in configs]:
        # the group's engines are gone once it returns: the next group's need the memory
        _measure_group(group, plan, args, err, prompts, m)
        _release_memory(plan.cuda)
    return m._replace(rows=with_break_even(m.rows))


def _measure_group(
    group: Sequence[BenchConfig],
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    prompts: BenchPrompts,
    m: Measurements,
) -> None:
    """Build the group's engines one after the other (each one's first request timed before
    the next is built), measure them together, and add what they measured to ``m``."""
    from eagletree.app.bench.windows import measure_windows

    engines: list[BenchEngine] = []
    for config in group:
        started = _start(plan, config, args, err, m.engines, held=len(engines))
        m.first_requests.append(_first_request(started, prompts, args, plan, err))
        engines.append(started)
    if args.arrivals is not None:
        m.arrival_rows.extend(_measure_arrivals(engines[0], plan, args, err, prompts))
    else:
        m.rows.extend(measure_windows(engines, plan, args, err, prompts))
    for e in engines:
        if args.hf and not e.config.speculative:
            m.hf_rows[:] = _measure_hf(plan, e.engine, args, err, prompts)
        learned = adaptive_state(e.engine)
        if learned is not None:
            m.adaptive[e.config.name] = learned


def _start(
    plan: BenchPlan,
    config: BenchConfig,
    args: argparse.Namespace,
    err: TextIO,
    used: dict[str, Any],
    *,
    held: int,
) -> BenchEngine:
    """``config``'s engine, built beside the ``held`` engines already built (its resolved
    settings into ``used``); MeasurementError where the device's memory cannot hold it too."""
    import torch

    from eagletree.app.bench.measure import MeasurementError
    from eagletree.app.bench.plan import settings_for
    from eagletree.app.bench.windows import BenchEngine

    settings = settings_for(plan, config)
    tp_size, dp_size = (size if size > 1 else None for size in (args.tp, args.dp))
    settings = with_parallel(settings, tp_size, dp_size)  # a flag at 1 keeps the file's size
    try:
        engine, replica, lockstep, used[config.name] = _build(settings, err)
    except torch.OutOfMemoryError as error:
        if not held:
            raise
        raise MeasurementError(
            f"--interleave holds every engine at once, and {config.name}'s does not fit beside "
            f"the {held} built before it ({str(error).splitlines()[0]}): run without "
            "--interleave, or with fewer --configs"
        ) from None
    # random weights: an EOS token would end a request at a random step
    engine.eos_token_ids = frozenset()
    return BenchEngine(engine, config, replica, lockstep)


def _first_request(
    e: BenchEngine, prompts: BenchPrompts, args: argparse.Namespace, plan: BenchPlan, err: TextIO
) -> FirstRequestRow:
    """The engine's first request (the first prompt of batch size 1), then the same again."""
    from eagletree.app.bench.latency import first_request_seconds
    from eagletree.app.bench.rows import FirstRequestRow

    prompt = prompts.batch(1, e.engine.vocab_size)[0]
    cold, warm = first_request_seconds(e.engine, prompt, args.new_tokens, plan.cuda, e.lockstep)
    config = e.config
    print(
        f"{config.name:<20} first request {1000 * cold:.1f} ms, again {1000 * warm:.1f} ms",
        file=err,
    )
    return FirstRequestRow(config.name, 1000.0 * cold, 1000.0 * warm)


def _measure_arrivals(
    e: BenchEngine,
    plan: BenchPlan,
    args: argparse.Namespace,
    err: TextIO,
    prompts: BenchPrompts,
) -> list[ArrivalRow]:
    """The arrivals rows of one engine: every batch size, under every ``--prefill-step``
    (switched on its scheduler, so that both run on the same engine and graphs)."""
    from eagletree.app.bench.arrivals import measure_arrivals
    from eagletree.app.bench.progress import ProgressBar

    engine, config = e.engine, e.config
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
    from eagletree.app.bench.rows import ArrivalRow

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
