"""Benchmark: the adaptive shape policy replayed on a GPU bench run's steps, on the CPU.

    eagletree bench --policy adaptive --configs plain chain:S3 ... --out run   # on the GPU
    python -m benchmarks.policy_replay --run run.json --out replay.md          # anywhere

A bench JSON of an adaptive engine holds, per cell (batch size, temperature), every fixed
configuration's step times and tokens a step, and the adaptive engine's start-up cost table.
Here each cell is decoded again, by every fixed shape and by ``AdaptiveShapes``, as the bench
decodes it (windows of ``bs`` requests of ``new_tokens`` each, ``--min-requests`` as the bench
reads it), with

- a step's time drawn from the steps the GPU measured for that shape in that cell (a plain
  step that catches the draft up: a plain step plus the table's catch-up excess), and
- each request's accepted path drawn from a model of the head fitted to the fixed shapes'
  tokens a step at that temperature (``replay_drafts``), read back one step late (overlap);

so the policy meets the costs, the noise and the static-tree error of the real run, and
``adaptive ÷ best fixed`` says what its choices, learning and exploration cost there.
``--option NAME=VALUE`` sets an ``AdaptiveShapes`` argument (to compare settings). A replay
is not the GPU: its acceptance is the model's, and what it shows is to be confirmed there.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_run import Cell, Run, read_run
from benchmarks.replay_clock import StepClock
from benchmarks.replay_drafts import DraftModel, accepted_drafts, fit_model
from eagletree.adapters.models.head_report import REPORT_NAME, read_rank_priors
from eagletree.app.bench.windows import windows_per_row
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.domain.draft_shape import PLAIN, DraftShape
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Replayed:
    """A replay of one cell: committed tokens per second, the steps each shape ran, and the
    worst window's longest step ÷ its median step, each step at its shape's mean measured
    seconds (the stalls the choices made, apart from the measured steps' own noise)."""

    tokens_per_s: float
    ran: Counter[DraftShape]
    worst_over_median: float


def replay_cell(
    run: Run,
    cell: Cell,
    model: DraftModel,
    policy: AdaptiveShapes | DraftShape,
    *,
    min_requests: int,
    seed: int,
    host_stalls: bool = False,
    switches: bool = False,
) -> Replayed:
    """``policy`` (a fixed shape, or the adaptive policy) over the cell's windows."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    clock = StepClock(cell, run.costs, rng, host_stalls, switches)
    worst = 1.0
    # an adaptive engine's plain steps leave their tokens in the draft's lag (where it has a
    # catch-up step), as ``SpeculativeWorker._runner_of`` runs them
    lags = isinstance(policy, AdaptiveShapes) and bool(run.costs.catch_up)
    sampled = cell.temperature > 0
    tokens = seconds = 0.0
    ran: Counter[DraftShape] = Counter()
    for window in range(windows_per_row(run.repeats, min_requests, cell.batch_size)):
        # as the bench's window: every request decodes until the slowest has new_tokens, its
        # budget outlasting that, and every token generated counts
        params = SamplingParams(max_new_tokens=run.new_tokens, temperature=cell.temperature)
        size = cell.batch_size
        decode = [Request(window * size + i, [1, 2], params, 4096) for i in range(size)]
        generated = torch.zeros(size, dtype=torch.int64)
        factors = model.request_factors(size, generator)
        noise = model.ease_noise(size, generator)  # the requests' ease, step by step
        lag = 0
        steps: list[float] = []
        pending: Callable[[], None] | None = None  # the step in flight, read back next step
        previous: DraftShape | None = None
        while int(generated.min()) < run.new_tokens:
            chosen = policy if isinstance(policy, DraftShape) else policy.choose(decode)
            catch_up = False
            if lags and chosen.is_plain and lag + 1 < run.costs.catch_up_every:
                shape, lag = PLAIN, lag + 1
            elif lags and (chosen.is_plain or lag):
                shape, lag, catch_up = PLAIN, 0, True  # a drafting shape waits one step
            else:
                shape = chosen
            place = float(generated.double().mean()) / run.new_tokens
            step_seconds = clock(shape, catch_up, place, previous)
            previous = shape
            steps.append(clock.mean(shape, catch_up))
            rows: list[list[int]] = []
            if shape.is_plain:
                committed = torch.ones(size, dtype=torch.int64)
            else:
                ranks, offered = model.paths(shape, factors, generator, noise)
                committed = 1 + accepted_drafts(ranks)
                rows = torch.cat([ranks, offered], dim=1).tolist()
            noise = model.ease_noise(size, generator, noise)  # the text moves on
            generated += committed
            for request, count in zip(decode, committed.tolist(), strict=True):
                request.output_ids.extend([0] * count)  # how far into its output (the policy)
            tokens += int(committed.sum())
            seconds += step_seconds
            ran[shape] += 1
            if pending is not None:
                pending()
            if isinstance(policy, AdaptiveShapes):
                pending = _read_back(policy, shape, decode, rows, sampled, step_seconds, catch_up)
        if pending is not None:
            pending()
        worst = max(worst, max(steps) / statistics.median(steps))
    return Replayed(tokens / seconds, ran, worst)


def _read_back(
    policy: AdaptiveShapes,
    shape: DraftShape,
    decode: list[Request],
    rows: list[list[int]],
    sampled: bool,
    seconds: float,
    catch_up: bool,
) -> Callable[[], None]:
    def read_back() -> None:
        policy.observe_time(shape, len(decode), sampled, seconds, catch_up=catch_up)
        if rows:
            policy.observe(shape, decode, rows)

    return read_back


def _option(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"--option wants NAME=VALUE, got {text!r}")
    return name.replace("-", "_"), float(value)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--run", type=Path, required=True, help="an eagletree bench JSON")
    p.add_argument(
        "--draft-dir",
        type=Path,
        help="the head's directory: its training.json prior (default: the priors the run's "
        "engine started from, where the run recorded them)",
    )
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument(
        "--batch-sizes", type=int, nargs="+", help="replay these batch sizes' cells only"
    )
    p.add_argument("--seeds", type=int, default=3, help="replays per cell, averaged")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--option", type=_option, action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--host-stalls",
        action="store_true",
        help="a step's time: a calm one of its shape's, stretched where the cell's steps "
        "show the host stalling at that point (runs of slow steps hit whatever runs)",
    )
    p.add_argument(
        "--switches",
        action="store_true",
        help="a step right after one of another shape takes the offset the run's adaptive "
        "steps showed after that switch (the host work of the step before, read back with it)",
    )
    p.add_argument(
        "--request-spread",
        type=float,
        help="how far requests' ease differs (each request's factor on it is uniform in 1 ± "
        "this; the fit's is 0.1): text whose requests differ more is what a policy reacting "
        "to its recent steps is judged by",
    )
    p.add_argument(
        "--persistence",
        type=float,
        help="how much of a request's ease carries over from one step to its next (the "
        "correlation of its normal draws; default 0, every step drawn afresh): easy "
        "stretches of text, which a policy reacting to its recent steps may chase",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not args.run.is_file():
        p.error(f"--run {args.run} is not a file: give an eagletree bench JSON")
    if args.draft_dir is not None and not (args.draft_dir / REPORT_NAME).is_file():
        p.error(f"--draft-dir {args.draft_dir} holds no {REPORT_NAME}")
    if args.seeds < 1 or args.min_requests < 1:
        p.error("--seeds and --min-requests must be at least 1")
    if args.request_spread is not None and not 0 <= args.request_spread < 1:
        p.error(f"--request-spread must be in [0, 1), got {args.request_spread:g}")
    if args.persistence is not None and not 0 <= args.persistence < 1:
        p.error(f"--persistence must be in [0, 1), got {args.persistence:g}")
    options: dict[str, Any] = dict(args.option)
    known = inspect.signature(AdaptiveShapes).parameters
    for name, value in options.items():
        if name not in known or name == "shapes":
            p.error(f"--option {name}: not an AdaptiveShapes argument")
        if isinstance(known[name].default, int) and not isinstance(known[name].default, bool):
            if value != int(value):
                p.error(f"--option {name}: a whole number, got {value:g}")
            options[name] = int(value)  # a count: an index or a range bound
    run = read_run(args.run)
    # the head's report where given, else the priors the GPU's engine started from
    priors = read_rank_priors(args.draft_dir) if args.draft_dir else dict(run.head_priors)
    models: dict[float, DraftModel] = {}
    lines = [
        f"Policy replay of {args.run} (min requests {args.min_requests}, {args.seeds} seeds"
        + (", host stalls" if args.host_stalls else "")
        + (", switch offsets" if args.switches else "")
        + (f", request spread {args.request_spread:g}" if args.request_spread is not None else "")
        + (f", persistence {args.persistence:g}" if args.persistence is not None else "")
        + (f", bs {' '.join(map(str, args.batch_sizes))} only" if args.batch_sizes else "")
        + (f", head priors: {', '.join(sorted(priors))}" if priors else ", the default prior")
        + "".join(f", {k}={v:g}" for k, v in options.items())
        + ")",
        "",
        "| T | bs | best fixed (others ÷ it) | adaptive ÷ best | ÷ plain | ran | worst ÷ median"
        " step | best replayed ÷ GPU | GPU: adaptive ÷ best |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    views: list[str] = []
    cells = [c for c in run.cells if not args.batch_sizes or c.batch_size in args.batch_sizes]
    if not cells:
        sizes = " ".join(map(str, args.batch_sizes))
        p.error(f"--batch-sizes {sizes}: the run has no cell of these batch sizes")
    for cell in cells:
        if cell.temperature not in models:
            fitted = fit_model(_pooled(run, cell.temperature))
            if args.request_spread is not None:
                fitted = dataclasses.replace(fitted, request_spread=args.request_spread)
            if args.persistence is not None:
                fitted = dataclasses.replace(fitted, persistence=args.persistence)
            models[cell.temperature] = fitted
        model = models[cell.temperature]
        fixed: dict[DraftShape, float] = {}
        adaptive, ran, stall = 0.0, Counter[DraftShape](), 1.0
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for shape in cell.seconds:
                replayed = replay_cell(run, cell, model, shape, min_requests=args.min_requests,
                                       seed=seed, host_stalls=args.host_stalls,
                                       switches=args.switches)  # fmt: skip
                fixed[shape] = fixed.get(shape, 0.0) + replayed.tokens_per_s / args.seeds
            policy = AdaptiveShapes(run.candidates, head_priors=priors, drawn_drafts=run.drawn,
                                    **options)  # fmt: skip
            policy.use_costs(run.costs)
            replayed = replay_cell(run, cell, model, policy, min_requests=args.min_requests,
                                   seed=seed, host_stalls=args.host_stalls,
                                   switches=args.switches)  # fmt: skip
            adaptive += replayed.tokens_per_s / args.seeds
            ran += replayed.ran
            stall = max(stall, replayed.worst_over_median)
        best = max(fixed, key=lambda s: fixed[s])
        ratios.append(adaptive / fixed[best])
        total = sum(ran.values())
        shares = ", ".join(f"{s.label} {100 * n / total:.0f} %" for s, n in ran.most_common(3))
        others = ", ".join(f"{s.label} {fixed[s] / fixed[best]:.2f}" for s in fixed if s != best)
        lines.append(
            f"| {cell.temperature:g} | {cell.batch_size} | {best.label} ({others}) | "
            f"{adaptive / fixed[best]:.2f} | {adaptive / fixed[PLAIN]:.2f} | {shares} | "
            f"{stall:.2f} | {fixed[best] / cell.tokens_per_s[best]:.2f} | {_gpu_ratio(run, cell)} |"
        )
        views.append(_priced(policy, cell, model, run))
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    lines += [
        "",
        f"Geometric mean of adaptive ÷ best fixed: {geomean:.3f}; least {min(ratios):.2f}.",
        "",
        "What the last replay's policy priced at its end (tokens a step / ms), against the "
        "model and the measured steps:",
        "",
        *views,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


def _priced(policy: AdaptiveShapes, cell: Cell, model: DraftModel, run: Run) -> str:
    costs = policy.costs
    assert costs is not None
    generator = torch.Generator().manual_seed(0)
    expected = policy.expected_accepted(cell.temperature)
    parts = []
    for shape, accepted in zip(policy.shapes, expected, strict=True):
        ms = 1e3 * costs.of(shape, cell.batch_size, cell.temperature > 0)
        true_ms = 1e3 * sum(cell.seconds[shape]) / len(cell.seconds[shape])
        true = model.tokens_per_step(shape, generator, 1024)
        parts.append(f"{shape.label} {1 + accepted:.2f}/{ms:.2f} ({true:.2f}/{true_ms:.2f})")
    return f"- T {cell.temperature:g} bs {cell.batch_size}: " + "; ".join(parts)


def _pooled(run: Run, temperature: float) -> dict[DraftShape, float]:
    """Each drafting shape's tokens a step at ``temperature``, averaged over batch sizes."""
    per_shape: dict[DraftShape, list[float]] = {}
    for cell in run.cells:
        if cell.temperature == temperature:
            for shape, value in cell.tokens_per_step.items():
                per_shape.setdefault(shape, []).append(value)
    return {s: sum(v) / len(v) for s, v in per_shape.items() if not s.is_plain}


def _gpu_ratio(run: Run, cell: Cell) -> str:
    """The GPU run's own adaptive ÷ best fixed in the cell."""
    measured = run.measured.get((cell.batch_size, cell.temperature))
    return "—" if measured is None else f"{measured / max(cell.tokens_per_s.values()):.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
