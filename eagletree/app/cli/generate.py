"""The `eagletree generate` command: prompts in (text or token ids), tokens and text out.

Without a target checkpoint in the settings it runs the embedded default (a tiny random
checkpoint with a byte-level tokenizer, created on first use, see ``default_checkpoint``);
"auto" settings pick CUDA when visible, else the CPU (see ``platform``). Progress, per-request
timings and the summary go to stderr; results to stdout: per prompt a line of token ids and,
with a tokenizer, a line of text, or with ``--json`` one JSON object per prompt. ``--stream``
prints the output as the engine commits it.

``--tp N`` runs the engine tensor-parallel over N ranks, ``--dp M`` as M data-parallel ranks
(each serving the prompts the router gives it; with both, M replicas of N ranks each):
launched by torchrun, this process is one of the N·M ranks; otherwise it spawns them (one per
device) and waits. Every rank runs the same command on the same prompts; rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from eagletree.app.cli import generate_output
from eagletree.app.engine.prompts import (
    PromptSpec,
    read_prompts_file,
    text_problem,
    to_prompt_ids,
)
from eagletree.app.parallel.launch import add_parallel_flags, launch_ranks, with_parallel
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine
    from eagletree.app.parallel.data_parallel import DataParallelEngine
    from eagletree.config.settings import EngineSettings

DEFAULT_PROMPT_IDS = (1, 2, 3, 4)
DEFAULT_PROMPT_TEXT = "The draft tree"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``generate`` to the ``eagletree`` subcommands (``subparsers.add_parser``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "generate",
        help="generate text or tokens for prompts",
        description="Generate with the engine. Without model.target_path in the settings a tiny "
        "random checkpoint (created on first use in the user cache directory) is used.",
    )
    parser.add_argument("--settings", metavar="FILE", help="a .toml, .yaml or .yml settings file")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt-ids",
        action="append",
        metavar='"1 2 3"',
        help="token ids separated by spaces or commas; repeat the option for a batch",
    )
    prompts.add_argument(
        "--prompt",
        action="append",
        metavar="TEXT",
        help="prompt text (encoded with the checkpoint's tokenizer); repeat for a batch",
    )
    prompts.add_argument(
        "--prompts-file",
        metavar="FILE.jsonl",
        type=Path,
        help='one JSON object per line: {"prompt": TEXT}, {"prompt_ids": [1, 2]} or '
        '{"messages": [{"role": "user", "content": TEXT}]}',
    )
    parser.add_argument(
        "--chat", action="store_true", help="wrap each --prompt in the checkpoint's chat template"
    )
    add_parallel_flags(
        parser, dp_help="ranks (parallel.dp_size), each with its own requests and KV pool"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None, help="prompt i samples with seed + i")
    parser.add_argument("--stop-token-ids", default=None, metavar='"2 7"')
    parser.add_argument("--stream", action="store_true", help="print output as it is generated")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``eagletree generate``; returns the exit status (0 ok, 1 bad input or settings)."""
    from eagletree.app.composition.run_settings import prepare_settings
    from eagletree.app.parallel import process_group  # imported here, as the engine: torch

    # resolved at call time, so that a redirected sys.stdout / sys.stderr is honoured
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    def note(message: str) -> None:
        print(message, file=err)

    try:
        _check_flags(args, note)
        settings = with_parallel(prepare_settings(args.settings, note), args.tp, args.dp)
        if settings.parallel.dp_size > 1 and args.stream:
            raise ValueError(
                "--stream is not supported with --dp (rank 0 sees only its own requests' tokens "
                "as they come): drop --stream, or run with --dp 1"
            )
        world_size = settings.parallel.tp_size * settings.parallel.dp_size
        if world_size > 1 and not process_group.in_process_group():
            return launch_ranks(
                run, args, world_size, lambda: _generate(args, settings, out, err), note
            )
    except (ConfigurationError, ValueError) as error:
        print(f"error: {error}", file=err)
        return 1
    return _generate(args, settings, out, err)


def _generate(args: argparse.Namespace, settings: EngineSettings, out: TextIO, err: TextIO) -> int:
    """This process's part once its settings are checked (and it is in its group, if any)."""
    from eagletree.app.composition.container import build_data_parallel_engine, build_engine
    from eagletree.app.engine.loop import Engine
    from eagletree.app.parallel import process_group

    def note(message: str) -> None:
        print(message, file=err)

    tp_size, dp_size = settings.parallel.tp_size, settings.parallel.dp_size
    try:
        seed = args.seed
        if tp_size > 1 and args.temperature > 0 and seed is None:
            seed = process_group.agreed_seed()  # a replica's ranks must draw the same coins
        if process_group.group_rank() != 0:  # every rank computes the results; rank 0 prints
            out = err = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
        specs = _prompt_specs(args, note)
        stop_ids = None if args.stop_token_ids is None else parse_ids(args.stop_token_ids)
        engine: Engine | DataParallelEngine = (
            build_data_parallel_engine(settings, note)
            if dp_size > 1
            else build_engine(settings, note)
        )
        with engine:
            if engine.tokenizer is None and specs[0][1].fallback_ids is not None:
                ids = " ".join(map(str, DEFAULT_PROMPT_IDS))
                note(f"the checkpoint has no tokenizer: the default prompt is the ids {ids}")
            prompts = [to_prompt_ids(spec, engine.tokenizer, index) for index, spec in specs]
            started = time.perf_counter()
            sampling = {
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "top_k": args.top_k,
                "top_p": args.top_p,
                "seed": seed,
                "stop_token_ids": stop_ids,
            }
            if args.stream:
                assert isinstance(engine, Engine)  # refused above with data parallelism
                results = generate_output.stream(
                    engine, prompts, sampling, out, json_lines=args.json
                )
            else:
                progress = None if args.no_progress else generate_output.ProgressLine(err)
                results = engine.generate(prompts, on_step=progress, **sampling)
                if progress is not None:
                    progress.close()
            elapsed = time.perf_counter() - started
    except (ConfigurationError, ValueError) as error:
        print(f"error: {error}", file=err)
        return 1
    if not args.stream:
        for index, result in enumerate(results):
            generate_output.print_result(index, result, out, json_lines=args.json)
    for index, result in enumerate(results):
        print(generate_output.format_timings(index, result), file=err)
    generate_output.print_summary(engine, results, elapsed, err)
    return 0


def _check_flags(args: argparse.Namespace, note: Any) -> None:
    """What the flags alone get wrong, before any model is loaded."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.temperature >= 0.0:  # also refuses NaN
        raise ValueError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    for number, text in enumerate(args.prompt or [], start=1):
        problem = text_problem(text)
        if problem is not None:
            raise ValueError(
                f"--prompt #{number} {problem}: give UTF-8 text, or token ids with --prompt-ids"
            )
    if args.temperature == 0.0:
        for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p)):
            if value is not None:
                note(f"warning: {flag} has no effect with greedy decoding (--temperature 0)")
        if args.seed is not None:
            note("warning: --seed has no effect with greedy decoding (--temperature 0)")
    if args.chat and not args.prompt:
        raise ValueError("--chat applies to --prompt TEXT (a prompts file gives messages itself)")
    if args.stream and args.json:
        note("warning: --stream with --json prints one JSON object per step and prompt")


def _prompt_specs(args: argparse.Namespace, note: Any) -> list[tuple[int, PromptSpec]]:
    if args.prompts_file is not None:
        return list(enumerate(read_prompts_file(args.prompts_file)))
    if args.prompt:
        if args.chat:
            return [
                (i, PromptSpec(messages=({"role": "user", "content": text},)))
                for i, text in enumerate(args.prompt)
            ]
        return [(i, PromptSpec(text=text)) for i, text in enumerate(args.prompt)]
    if args.prompt_ids:
        return [(i, PromptSpec(ids=tuple(parse_ids(ids)))) for i, ids in enumerate(args.prompt_ids)]
    note(f"no prompt given: using the prompt {DEFAULT_PROMPT_TEXT!r}")
    return [(0, PromptSpec(text=DEFAULT_PROMPT_TEXT, fallback_ids=DEFAULT_PROMPT_IDS))]


def parse_ids(text: str) -> list[int]:
    """``"1 2, 3"`` → [1, 2, 3]; ValueError naming the first item that is not an integer."""
    items = text.replace(",", " ").split()
    ids: list[int] = []
    for item in items:
        try:
            ids.append(int(item))
        except ValueError:
            raise ValueError(f"token id {item!r} in {text!r} is not an integer") from None
    return ids
