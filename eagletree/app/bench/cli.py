"""The `eagletree bench` command: decode throughput of plain, chain and tree configurations.

One run builds one engine per configuration (``build_engine_container``), times its first
request and the same again (cold and warm), and measures every batch size with it: steady decode
steps after the prefill (tok/s, ms/step, worst ÷ median step, tokens per step), then a few steps
under ``torch.profiler`` (kernels per step, GPU ms per step, GPU-busy share). The prompts are
random ids, or ``--prompts`` documents cut into windows by the target's tokenizer. A
speculative row's break-even acceptance length is its step time over the plain row's; plain is
added to the run whenever a speculative configuration is asked for. ``--hf`` also times
transformers' ``generate`` on the same checkpoint. The progress goes to stderr, the markdown
table to stdout, and with ``--out PATH`` to PATH.md and PATH.json (rows and settings).
``--tp N`` measures every engine tensor-parallel over N ranks (spawned, or torchrun's): each
rank runs the same measurements; rank 0 prints and writes. ``--dp M`` measures M data-parallel
replicas (of N ranks each with ``--tp``): a batch of ``bs`` requests is spread over them by the
router, the replicas step in lockstep, and a row is the group's (tok/s of all replicas, ms per
lockstep step; launches and device time from rank 0's profile, replica 0's share alone).
``--interleave`` holds every engine at once and decodes each draw of prompts with all of them
before the next (``app/bench/windows.py``): the rows of a cell share the machine's drift.

``--arrivals K`` measures requests arriving instead (``app/bench/arrivals.py``): ``bs``
background requests decode throughout while a new one (``--prompt-len``, ``--new-tokens``)
arrives every K steps, ``--num-arrivals`` in all; the window ends when the last arrival has
finished. A row is (configuration, bs, ``scheduler.prefill_step``): tok/s of every request over
the window, the arrivals' mean time to first token, the window's steps (no profile). Several
``--prefill-step`` values are each measured on the same engine, one after the other.

    eagletree bench                          # the tiny preset; its defaults fit the CPU
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
from typing import TYPE_CHECKING, Any, TextIO

from eagletree.app.bench.options import check_flags, parser
from eagletree.app.parallel.launch import launch_ranks
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.bench.plan import BenchPlan


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``eagletree bench``; 0 ok, 1 bad settings or a failed measurement, 2 bad flags."""
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    check_flags(p, args)
    # kineto prints a line whenever a profile starts and stops; keep stderr for the progress
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    return run(args)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Measure, print and write the report; ``args`` as ``parser()`` makes them."""
    from eagletree.app.bench.adaptive_table import adaptive_lines
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
        configs = parse_configs(args.configs, adaptive=args.policy == "adaptive")
        with _rank_zero_first(rank):  # it writes a missing preset; the others then read it
            plan = plan_run(args, configs, lambda message: print(message, file=err))
        m = measure_all(plan, configs, args, err)
    except (ConfigurationError, MeasurementError, OSError) as error:
        print(f"error: {error}", file=err)
        return 1
    header = _header(plan, args, m.engines)
    if rank != 0:
        return 0
    if args.arrivals is not None:
        markdown = render_arrivals_markdown(header["title"], m.arrival_rows, m.first_requests)
    else:
        markdown = render_markdown(
            header["title"],
            m.rows,
            m.hf_rows,
            cuda=plan.cuda,
            breakdown=args.breakdown,
            first_requests=m.first_requests,
        )
        markdown += "".join(f"{line}\n" for line in adaptive_lines(m.rows))
    print(markdown, end="", file=out)
    if args.out is not None:
        rows = m.arrival_rows if args.arrivals is not None else m.rows
        settings = {"argv": _argv(args), "engines": m.engines}
        data = report_json(header, rows, m.hf_rows, settings, m.first_requests, m.adaptive)
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


def _header(plan: BenchPlan, args: argparse.Namespace, engines: dict[str, Any]) -> dict[str, Any]:
    import torch

    base = plan.base
    device = torch.cuda.get_device_name() if plan.cuda else platform.processor() or "cpu"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = (
        f"eagletree bench: {device}, torch {torch.__version__}, {base.model.dtype}, "
        f"attention {base.backend.attention}, "
        f"cuda_graph {resolved_value(engines, 'backend', 'cuda_graph')}, "
        f"overlap {resolved_value(engines, 'scheduler', 'overlap')}, "
        f"{_sampled_drafts(engines)}"
        f"{f'tp {args.tp}, ' if args.tp > 1 else ''}"
        f"{f'arrival every {args.arrivals} steps x {args.num_arrivals}, ' if args.arrivals else ''}"
        f"{f'dp {args.dp}, ' if args.dp > 1 else ''}"
        f"draft {plan.draft_kind}"
        f"{f' (token map {args.token_map})' if args.token_map is not None else ''}, "
        f"{f'prompts from {_names(args.prompts)}, ' if args.prompts else ''}"
        f"prompt {args.prompt_len}, new tokens {args.new_tokens}, "
        f"{'engines interleaved, ' if args.interleave else ''}{date}"
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


def resolved_value(engines: dict[str, Any], section: str, name: str) -> str:
    """The value every engine resolved ``section.name`` to, or each value with its engines."""
    by_value: dict[str, list[str]] = {}
    for config, settings in engines.items():
        by_value.setdefault(str(settings[section][name]), []).append(config)
    if len(by_value) == 1:
        return next(iter(by_value))
    return " / ".join(f"{value} ({', '.join(configs)})" for value, configs in by_value.items())


def _sampled_drafts(engines: dict[str, Any]) -> str:
    """How the speculative engines draft for sampling requests (a header's phrase)."""
    drafting = {c: s for c, s in engines.items() if s["speculative"]["algorithm"] != "none"}
    if not drafting:
        return ""
    return f"sampled drafts {resolved_value(drafting, 'speculative', 'sampled_drafts')}, "


def _names(paths: list[Path]) -> str:
    return " ".join(map(str, paths))


def _argv(args: argparse.Namespace) -> dict[str, Any]:
    def plain(value: Any) -> Any:  # what JSON can hold: paths as strings, lists of them too
        if isinstance(value, list):
            return [plain(item) for item in value]
        return str(value) if isinstance(value, Path) else value

    return {key: plain(value) for key, value in vars(args).items()}


if __name__ == "__main__":
    sys.exit(main())
