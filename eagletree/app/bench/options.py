"""Application: the options of `eagletree bench`, their defaults by checkpoint, and the checks
that end a bad combination in one line (exit status 2) before anything is built.

The defaults of what to measure follow the checkpoint: the tiny preset (asked for, or implied
by no --target and no --settings) is the CPU preset, measured in seconds; a real-sized one
(``--preset llama3-8b``, ``--target``, a settings file) gets the table the performance plan
starts from.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from eagletree.app.parallel.launch import add_parallel_flags
from eagletree.domain.errors import ConfigurationError

DRAFT_KINDS = ("eagle", "eagle3", "mtp")
PREFILL_STEPS = ("with_decode", "alone")
PROMPT_FORMATS = 'text files, JSONL with a "text" field per line, or directories of them'


@dataclass(frozen=True, slots=True)
class MeasureDefaults:
    """What a run measures when its flags do not say."""

    configs: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    min_requests: int


TINY_DEFAULTS = MeasureDefaults(("plain", "chain:S3", "tree:S5,k4,N8"), (1, 4), 32, 16, 1)
FULL_DEFAULTS = MeasureDefaults(
    ("plain", "chain:S3", "tree:S5,k4,N8", "tree:S6,k8,N32"), (1, 8, 32), 256, 48, 16
)


def measure_defaults(args: argparse.Namespace) -> MeasureDefaults:
    """The tiny preset's defaults when it is the checkpoint, else the full table's."""
    implied = args.preset is None and args.target is None and args.settings is None
    return TINY_DEFAULTS if args.preset == "tiny" or implied else FULL_DEFAULTS


class _Parser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr and exit status 2, with no usage dump; what to
    measure defaults by checkpoint (``measure_defaults``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(  # type: ignore[override]  # argparse's overloads, one used here
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        defaults = measure_defaults(parsed)
        for name in ("configs", "batch_sizes", "prompt_len", "new_tokens", "min_requests"):
            if getattr(parsed, name) is None:
                value = getattr(defaults, name)
                setattr(parsed, name, list(value) if isinstance(value, tuple) else value)
        return parsed, extra


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except those decided by the checkpoint (given in the text)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def _by_checkpoint(name: str) -> str:
    tiny, full = getattr(TINY_DEFAULTS, name), getattr(FULL_DEFAULTS, name)

    def shown(value: Any) -> str:
        return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)

    return f"(default: {shown(tiny)} for the tiny preset, else {shown(full)})"


def parser() -> argparse.ArgumentParser:
    """The options of ``eagletree bench``."""
    from eagletree.adapters.models.random_checkpoint_config import PRESETS

    p = _Parser(
        prog="eagletree bench",
        description="Decode throughput of plain, chain and tree configurations.",
        formatter_class=_HelpFormatter,
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
        metavar="SPEC",
        help=f"plain, chain:S<n>, tree:S<n>,k<n>,N<n> {_by_checkpoint('configs')}",
    )
    runs.add_argument(
        "--policy",
        choices=["fixed", "adaptive"],
        default="fixed",
        help="adaptive: also measure speculative.policy = adaptive over the --configs shapes",
    )
    runs.add_argument(
        "--batch-sizes", nargs="+", type=int, metavar="BS", help=_by_checkpoint("batch_sizes")
    )
    runs.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=[0.0],
        metavar="T",
        help="sampling temperatures, each measured at every batch size (0: greedy; request i "
        "seeded with i)",
    )
    runs.add_argument(
        "--prompts",
        nargs="+",
        type=Path,
        metavar="FILE",
        help=f"documents to cut the prompts from ({PROMPT_FORMATS}, as train-draft --data "
        "reads), tokenised by the target's tokenizer; default: random token ids",
    )
    runs.add_argument(
        "--prompt-len",
        type=int,
        metavar="N",
        help=f"tokens a prompt {_by_checkpoint('prompt_len')}",
    )
    runs.add_argument(
        "--new-tokens",
        type=int,
        metavar="N",
        help=f"timed, per request {_by_checkpoint('new_tokens')}",
    )
    runs.add_argument("--warmup-steps", type=int, default=2, metavar="N")
    runs.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="windows per batch size and temperature, each on another draw of prompts, measured"
        " as one (a sampled bs-1 row is otherwise one random continuation)",
    )
    runs.add_argument(
        "--min-requests",
        type=int,
        metavar="N",
        help="at small batch sizes, more windows than --repeats until a row holds N requests "
        "(a bs-1 row of two prompts measures those two texts) "
        f"{_by_checkpoint('min_requests')}",
    )
    runs.add_argument(
        "--interleave",
        action="store_true",
        help="hold every configuration's engine at once and decode each draw of prompts with "
        "all of them before the next draw, so that a drift in the machine's speed weighs on "
        "every configuration of a cell alike (needs the memory of all the engines together)",
    )
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
    runs.add_argument(
        "--seed", type=int, default=0, help="of the prompts (random ids or --prompts windows)"
    )
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


def check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, values, least in (
        ("--batch-sizes", args.batch_sizes, 1),
        ("--prompt-len", [args.prompt_len], 1),
        ("--new-tokens", [args.new_tokens], 1),
        ("--warmup-steps", [args.warmup_steps], 0),
        ("--repeats", [args.repeats], 1),
        ("--min-requests", [args.min_requests], 1),
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
    if args.interleave and args.arrivals is not None:
        p.error("--interleave alternates decode windows: run it without --arrivals")
    if args.interleave and (args.tp > 1 or args.dp > 1):
        p.error("--interleave holds its engines in one process: run it without --tp and --dp")
    if args.arrivals is not None and args.hf:
        p.error("--hf is compared with the decode window: run it without --arrivals")
    if args.prefill_step is not None and len(args.prefill_step) > 1 and args.arrivals is None:
        p.error(
            "several --prefill-step values are compared by --arrivals K (the decode window "
            "has no prefill)"
        )
    for path in args.prompts or ():
        if not path.exists():
            p.error(f"--prompts {path} does not exist: give {PROMPT_FORMATS}")
    if args.target is not None and args.preset is not None:
        p.error("give --preset or --target, not both")
    if args.token_map is not None and args.draft not in (None, "eagle"):
        p.error(f"--token-map restricts an EAGLE head, not --draft {args.draft}")
    if args.draft_dir is not None and args.target is None:
        p.error("--draft-dir needs --target")
    if args.checkpoint_dir is not None and args.target is not None:
        p.error("--checkpoint-dir is where a --preset is written; with --target it means nothing")
    from eagletree.app.bench.configs import parse_configs

    if any(t < 0 for t in args.temperatures):
        p.error(f"--temperatures must be >= 0, got {' '.join(map(str, args.temperatures))}")
    if args.policy == "adaptive" and (args.tp > 1 or args.arrivals is not None):
        p.error("--policy adaptive measures the decode window of one process group")
    try:
        parse_configs(args.configs, adaptive=args.policy == "adaptive")
    except ConfigurationError as error:
        p.error(str(error))
