"""The `eagletree generate` command: prompts in (token ids, or text with a tokenizer), tokens out.

Without a target checkpoint in the settings it runs the embedded default (a tiny random
checkpoint created on first use, see ``default_checkpoint``); without a settings file and
without CUDA it runs on the CPU with the torch backends. Progress goes to stderr, results to
stdout (one line of token ids per prompt, and the text when a tokenizer is available); with
speculation the mean acceptance length and its histogram follow the summary on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.engine import StepReport
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.request import AcceptanceStats

DEFAULT_PROMPT_IDS = (1, 2, 3, 4)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``generate`` to the ``eagletree`` subcommands (``subparsers.add_parser``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "generate",
        help="generate tokens for prompts",
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
        help="prompt text (needs tokenizer.json in the checkpoint and the tokenizers package); "
        "repeat for a batch",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None, help="prompt i samples with seed + i")
    parser.add_argument("--stop-token-ids", default=None, metavar='"2 7"')
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``eagletree generate``; returns the exit status (0 ok, 1 bad input or settings)."""
    from eagletree.app.engine import Engine

    # resolved at call time, so that a redirected sys.stdout / sys.stderr is honoured
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    try:
        settings = _settings(args, err)
        target_path = Path(str(settings.model.target_path))
        tokenizer = load_tokenizer(target_path)
        prompts = _prompts(args, tokenizer, err)
        stop_ids = None if args.stop_token_ids is None else parse_ids(args.stop_token_ids)
        engine = Engine.from_settings(settings)
        progress = None if args.no_progress else ProgressLine(err)
        started = time.perf_counter()
        results = engine.generate(
            prompts,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop_token_ids=stop_ids,
            on_step=progress,
        )
        elapsed = time.perf_counter() - started
    except (ConfigurationError, ValueError) as error:
        print(f"error: {error}", file=err)
        return 1
    if progress is not None:
        progress.close()
    for index, result in enumerate(results):
        ids = " ".join(str(token) for token in result.output_ids)
        print(f"[{index}] {ids}  ({result.finish_reason.value})", file=out)
        if tokenizer is not None:
            print(f"[{index}] text: {json.dumps(tokenizer.decode(result.output_ids))}", file=out)
    stats = engine.stats
    num_tokens = sum(len(result.output_ids) for result in results)
    rate = num_tokens / elapsed if elapsed > 0 else 0.0
    print(
        f"generated {num_tokens} tokens for {len(results)} prompt(s) in {elapsed:.2f} s: "
        f"{rate:.1f} tok/s ({stats.num_steps} steps, {stats.num_prefill_tokens} prompt tokens "
        f"prefilled, {stats.num_retracted} retracted)",
        file=err,
    )
    if stats.acceptance is not None:
        print(format_acceptance(stats.acceptance), file=err)
    return 0


def format_acceptance(acceptance: AcceptanceStats) -> str:
    """One line: the mean acceptance length and the histogram of tokens per verify step."""
    counts = ", ".join(
        f"{tokens}: {steps}" for tokens, steps in enumerate(acceptance.histogram) if steps
    )
    return (
        f"speculation: mean acceptance length {acceptance.mean_accept_length:.2f} tokens per "
        f"verify step over {acceptance.num_steps} steps; histogram (tokens: steps) {counts}"
    )


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


def load_tokenizer(checkpoint: Path) -> Tokenizer | None:
    """The checkpoint's tokenizer.json through the ``tokenizers`` package, or None."""
    file = checkpoint / "tokenizer.json"
    if not file.is_file() or importlib.util.find_spec("tokenizers") is None:
        return None
    from tokenizers import Tokenizer as HFTokenizer

    return _HFTokenizer(HFTokenizer.from_file(str(file)))


class _HFTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids)
        return text


class ProgressLine:
    """One self-overwriting status line on a terminal; a line every few seconds otherwise."""

    def __init__(self, stream: TextIO, interval_s: float | None = None) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval_s = interval_s if interval_s is not None else (0.1 if self._tty else 2.0)
        self._last = 0.0
        self._shown = False

    def __call__(self, report: StepReport) -> None:
        now = time.perf_counter()
        if now - self._last < self._interval_s:
            return
        self._last = now
        rate = report.num_generated_tokens / report.elapsed_s if report.elapsed_s > 0 else 0.0
        line = (
            f"step {report.step}: {report.num_running} running, {report.num_waiting} waiting, "
            f"{report.num_finished} done, {report.num_generated_tokens} tokens, {rate:.1f} tok/s"
        )
        self._stream.write(f"\r{line}\033[K" if self._tty else f"{line}\n")
        self._stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._tty and self._shown:
            self._stream.write("\n")
            self._stream.flush()


def _settings(args: argparse.Namespace, err: TextIO) -> EngineSettings:
    import torch

    from eagletree.app.default_checkpoint import default_draft_dir, ensure_default_checkpoint
    from eagletree.config.settings import EngineSettings

    settings = EngineSettings.from_file(args.settings) if args.settings else EngineSettings()
    model = settings.model
    if model.device.startswith("cuda") and not torch.cuda.is_available():
        if args.settings:
            raise ConfigurationError(
                f"model.device = {model.device!r} but no CUDA device is visible: set "
                "model.device = 'cpu' (with backend.attention = 'torch')"
            )
        print("no CUDA device: running on the CPU in float32 with the torch backends", file=err)
        settings = settings.model_copy(
            update={
                "model": model.model_copy(update={"device": "cpu", "dtype": "float32"}),
                "backend": settings.backend.model_copy(
                    update={"attention": "torch", "kv_move": "torch"}
                ),
            }
        )
    if settings.model.target_path is None:
        path = ensure_default_checkpoint(notify=lambda message: print(message, file=err))
        model_update = {"target_path": str(path)}
        if settings.model.draft_path is None:
            model_update["draft_path"] = str(default_draft_dir(path))
        speculative = settings.speculative
        if "algorithm" not in speculative.model_fields_set:  # nobody chose: show the trees
            speculative = speculative.model_copy(update={"algorithm": "eagle"})
            print(
                "embedded default: EAGLE tree speculation with the default checkpoint's draft "
                "head (set EAGLETREE_SPECULATIVE__ALGORITHM=none to turn it off)",
                file=err,
            )
        settings = settings.model_copy(
            update={
                "model": settings.model.model_copy(update=model_update),
                "speculative": speculative,
            }
        )
    return settings


def _prompts(args: argparse.Namespace, tokenizer: Tokenizer | None, err: TextIO) -> list[list[int]]:
    if args.prompt:
        if tokenizer is None:
            raise ValueError(
                "--prompt needs the checkpoint's tokenizer.json and the tokenizers package "
                "(pip install tokenizers); give token ids with --prompt-ids instead"
            )
        return [tokenizer.encode(text) for text in args.prompt]
    if args.prompt_ids:
        return [parse_ids(text) for text in args.prompt_ids]
    default = " ".join(str(token) for token in DEFAULT_PROMPT_IDS)
    print(f'no prompt given: using --prompt-ids "{default}"', file=err)
    return [list(DEFAULT_PROMPT_IDS)]
