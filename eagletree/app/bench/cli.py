"""The `eagletree bench` command: decode throughput of plain, chain and tree configurations.

One run builds one engine per configuration (``Engine.from_settings``) and measures every batch
size with it: steady decode steps after the prefill (tok/s, ms/step, tokens per step), then a
few steps under ``torch.profiler`` (kernels per step, GPU ms per step, GPU-busy share). A
speculative row's break-even acceptance length is its step time over the plain row's; plain is
added to the run whenever a speculative configuration is asked for. ``--hf`` also times
transformers' ``generate`` on the same checkpoint. The progress goes to stderr, the markdown
table to stdout, and with ``--out PATH`` to PATH.md and PATH.json (rows and settings).
``--tp N`` measures every engine tensor-parallel over N ranks (spawned, or torchrun's): each
rank runs the same measurements; rank 0 prints and writes. ``--dp M`` measures M data-parallel
replicas (of N ranks each with ``--tp``): a batch of ``bs`` requests is spread over them by the
router, the replicas step in lockstep, and a row is the group's (tok/s of all replicas, ms per
lockstep step; launches and device time from rank 0's profile, replica 0's share alone).

``--arrivals K`` measures requests arriving instead (``app/bench/arrivals.py``): ``bs``
background requests decode throughout while a new one (``--prompt-len``, ``--new-tokens``)
arrives every K steps, ``--num-arrivals`` in all; the window ends when the last arrival has
finished. A row is (configuration, bs, ``scheduler.prefill_step``): tok/s of every request over
the window, the arrivals' mean time to first token, the window's steps (no profile). Several
``--prefill-step`` values are each measured on the same engine, one after the other.

    eagletree bench --preset tiny --device cpu --batch-sizes 1 2 --new-tokens 8
    eagletree bench --preset llama3-8b --draft eagle3 --configs plain tree:S5,k4,N8 --hf
    eagletree bench --preset llama3-8b --arrivals 4 --prefill-step with_decode alone
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from eagletree.app.parallel.launch import add_parallel_flags, launch_ranks
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.bench.plan import BenchPlan

DEFAULT_CONFIGS = ("plain", "chain:S3", "tree:S5,k4,N8", "tree:S6,k8,N32")
DRAFT_KINDS = ("eagle", "eagle3", "mtp")
PREFILL_STEPS = ("with_decode", "alone")


class _Parser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr and exit status 2, with no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def parser() -> argparse.ArgumentParser:
    """The options of ``eagletree bench``."""
    from eagletree.adapters.models.random_checkpoint_config import PRESETS

    p = _Parser(
        prog="eagletree bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    source = p.add_argument_group("checkpoint (default: --preset tiny)")
    source.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="random bf16 target + draft head, written on first use (llama3-8b: 16 GB)",
    )
    source.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help="where the preset is written; default: the user cache (bench-<preset>-<draft>-v1)",
    )
    source.add_argument("--settings", metavar="FILE", help="base settings (.toml/.yaml)")
    source.add_argument("--target", type=Path, metavar="DIR", help="target checkpoint directory")
    source.add_argument("--draft-dir", type=Path, metavar="DIR", help="draft head directory")
    source.add_argument(
        "--draft",
        choices=DRAFT_KINDS,
        help="draft head kind; default: the settings file's algorithm, else eagle",
    )
    source.add_argument(
        "--token-map",
        type=Path,
        metavar="FILE",
        help="speculative.token_map: the EAGLE head proposes from these target ids only "
        "(.pt tensor or .json list)",
    )
    runs = p.add_argument_group("what to measure")
    runs.add_argument(
        "--configs",
        nargs="+",
        default=list(DEFAULT_CONFIGS),
        metavar="SPEC",
        help="plain, chain:S<n>, tree:S<n>,k<n>,N<n>",
    )
    runs.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32], metavar="BS")
    runs.add_argument("--prompt-len", type=int, default=256, metavar="N")
    runs.add_argument("--new-tokens", type=int, default=48, metavar="N", help="timed, per request")
    runs.add_argument("--warmup-steps", type=int, default=2, metavar="N")
    runs.add_argument("--profile-steps", type=int, default=3, metavar="N", help="0: no profile")
    runs.add_argument("--hf", action="store_true", help="also time transformers' generate")
    runs.add_argument(
        "--breakdown", action="store_true", help="print each row's costliest kernels (CUDA)"
    )
    runs.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="write each row's profiled steps as a Chrome trace, DIR/<config>-bs<N>.json",
    )
    runs.add_argument("--seed", type=int, default=0, help="of the random prompts")
    runs.add_argument(
        "--arrivals",
        type=int,
        metavar="K",
        help="arrivals mode: bs requests keep decoding while a new one arrives every K steps; "
        "reports tok/s, mean time to first token and steps (no profile)",
    )
    runs.add_argument(
        "--num-arrivals",
        type=int,
        default=8,
        metavar="A",
        help="arrivals of one --arrivals run; it ends when the last one has finished",
    )
    engine = p.add_argument_group("engine (default: the settings file, else by device)")
    engine.add_argument("--device", help="cuda if available, else cpu")
    engine.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    engine.add_argument("--attention", choices=["torch", "triton", "flash"])
    engine.add_argument("--kv-move", choices=["torch", "triton"])
    engine.add_argument("--cuda-graph", choices=["auto", "on", "off"])
    add_parallel_flags(
        engine,
        default=1,
        dp_help="replicas (parallel.dp_size): each batch is spread over M replicas stepping in "
        "lockstep, bs being the group's total",
    )
    engine.add_argument(
        "--overlap",
        choices=["auto", "off"],
        help="scheduler.overlap; auto: the v2 and plain workers run one step ahead on CUDA",
    )
    engine.add_argument(
        "--prefill-step",
        nargs="+",
        choices=PREFILL_STEPS,
        help="scheduler.prefill_step: prefills beside the decode batch or in a step of their own; "
        "with --arrivals several values are measured one after the other on the same engine",
    )
    p.add_argument("--out", type=Path, metavar="PATH", help="write PATH.md and PATH.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``eagletree bench``; 0 ok, 1 bad settings or a failed measurement, 2 bad flags."""
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    _check_flags(p, args)
    # kineto prints a line whenever a profile starts and stops; keep stderr for the progress
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    return run(args)


def _check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, values, least in (
        ("--batch-sizes", args.batch_sizes, 1),
        ("--prompt-len", [args.prompt_len], 1),
        ("--new-tokens", [args.new_tokens], 1),
        ("--warmup-steps", [args.warmup_steps], 0),
        ("--profile-steps", [args.profile_steps], 0),
        ("--arrivals", [] if args.arrivals is None else [args.arrivals], 1),
        ("--num-arrivals", [args.num_arrivals], 1),
    ):
        if any(value < least for value in values):
            p.error(f"{flag} must be at least {least}, got {' '.join(map(str, values))}")
    for flag, size in (("--tp", args.tp), ("--dp", args.dp)):
        if size < 1:
            p.error(f"{flag} must be at least 1, got {size}")
        if args.hf and size > 1:
            p.error(f"--hf times transformers in one process: run it without {flag}")
    if args.arrivals is not None and args.dp > 1:
        p.error("--arrivals steps one engine: run it without --dp")
    if args.arrivals is not None and args.hf:
        p.error("--hf is compared with the decode window: run it without --arrivals")
    if args.prefill_step is not None and len(args.prefill_step) > 1 and args.arrivals is None:
        p.error(
            "several --prefill-step values are compared by --arrivals K (the decode window "
            "has no prefill)"
        )
    if args.target is not None and args.preset is not None:
        p.error("give --preset or --target, not both")
    if args.token_map is not None and args.draft not in (None, "eagle"):
        p.error(f"--token-map restricts an EAGLE head, not --draft {args.draft}")
    if args.draft_dir is not None and args.target is None:
        p.error("--draft-dir needs --target")
    if args.checkpoint_dir is not None and args.target is not None:
        p.error("--checkpoint-dir is where a --preset is written; with --target it means nothing")
    from eagletree.app.bench.configs import parse_configs

    try:
        parse_configs(args.configs)
    except ConfigurationError as error:
        p.error(str(error))


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Measure, print and write the report; ``args`` as ``parser()`` makes them."""
    from eagletree.app.bench.configs import parse_configs
    from eagletree.app.bench.measure import MeasurementError
    from eagletree.app.bench.plan import plan_run
    from eagletree.app.bench.report import (
        render_arrivals_markdown,
        render_markdown,
        report_json,
        write_report,
    )
    from eagletree.app.bench.runs import measure_all
    from eagletree.app.parallel import process_group

    if args.tp * args.dp > 1 and not process_group.in_process_group():
        stderr = sys.stderr if err is None else err
        # under torchrun: this same command again, as a rank of torchrun's group
        return launch_ranks(
            run,
            args,
            args.tp * args.dp,
            lambda: run(args, out, err),
            lambda message: print(message, file=stderr),
        )
    rank = process_group.group_rank()
    if rank != 0:  # every rank measures; rank 0 reports
        out = err = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        configs = parse_configs(args.configs)
        with _rank_zero_first(rank):  # it writes a missing preset; the others then read it
            plan = plan_run(args, configs, lambda message: print(message, file=err))
        rows, arrival_rows, hf_rows, used = measure_all(plan, configs, args, err)
    except (ConfigurationError, MeasurementError, OSError) as error:
        print(f"error: {error}", file=err)
        return 1
    header = _header(plan, args)
    if rank != 0:
        return 0
    if args.arrivals is not None:
        markdown = render_arrivals_markdown(header["title"], arrival_rows)
    else:
        markdown = render_markdown(
            header["title"], rows, hf_rows, cuda=plan.cuda, breakdown=args.breakdown
        )
    print(markdown, end="", file=out)
    if args.out is not None:
        measured = arrival_rows if args.arrivals is not None else rows
        data = report_json(header, measured, hf_rows, {"argv": _argv(args), "engines": used})
        md, js = write_report(args.out, markdown, data)
        print(f"wrote {md} and {js}", file=err)
    return 0


@contextlib.contextmanager
def _rank_zero_first(rank: int) -> Iterator[None]:
    """Run the block on rank 0, then on the others (nothing to wait for outside a group)."""
    from eagletree.app.parallel import process_group

    if rank != 0:
        process_group.barrier()
    yield
    if rank == 0 and process_group.in_process_group():
        process_group.barrier()


def _header(plan: BenchPlan, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    base = plan.base
    device = torch.cuda.get_device_name() if plan.cuda else platform.processor() or "cpu"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = (
        f"eagletree bench: {device}, torch {torch.__version__}, {base.model.dtype}, "
        f"attention {base.backend.attention}, cuda_graph {base.backend.cuda_graph}, "
        f"overlap {base.scheduler.overlap}, {f'tp {args.tp}, ' if args.tp > 1 else ''}"
        f"{f'arrival every {args.arrivals} steps x {args.num_arrivals}, ' if args.arrivals else ''}"
        f"{f'dp {args.dp}, ' if args.dp > 1 else ''}"
        f"draft {plan.draft_kind}"
        f"{f' (token map {args.token_map})' if args.token_map is not None else ''}, "
        f"prompt {args.prompt_len}, new tokens {args.new_tokens}, {date}"
    )
    return {
        "title": title,
        "device": device,
        "torch": torch.__version__,
        "dtype": base.model.dtype,
        "launches": ("CUDA kernels, copies and memsets" if plan.cuda else "top-level aten ops")
        + (" of rank 0's profile (replica 0's share of the batch)" if args.dp > 1 else ""),
        "date": date,
        "target": str(plan.target),
        "draft": None if plan.draft is None else str(plan.draft),
        "token_map": base.speculative.token_map,
    }


def _argv(args: argparse.Namespace) -> dict[str, Any]:
    return {key: str(v) if isinstance(v, Path) else v for key, v in vars(args).items()}


if __name__ == "__main__":
    sys.exit(main())
