"""Application: what `eagletree generate` prints — each prompt's result (token ids and text, or
one JSON object with ``--json``), the output as the engine commits it (``--stream``), the
per-request timings, the run's summary and the progress line.

Results go to ``out`` (stdout), the rest to the error stream; the callers pass both.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine
    from eagletree.app.engine.reports import GenerationResult, StepReport
    from eagletree.app.parallel.data_parallel import DataParallelEngine
    from eagletree.domain.acceptance_stats import AcceptanceStats


def stream(
    engine: Engine,
    prompts: list[list[int]],
    sampling: dict[str, Any],
    out: TextIO,
    *,
    json_lines: bool,
) -> list[GenerationResult]:
    """Generate ``prompts`` with ``engine.stream``, printing each step's new output (one
    prompt: the text as it grows; several: a line per prompt and step; or JSON lines)."""
    results: dict[int, GenerationResult] = {}
    single = len(prompts) == 1
    for event in engine.stream(prompts, **sampling):
        if json_lines:
            payload = {"index": event.index, "token_ids": event.token_ids, "text": event.text}
            if event.finish_reason is not None:
                payload["finish_reason"] = event.finish_reason.value
            print(json.dumps(payload), file=out, flush=True)
        elif single:
            piece = event.text if engine.tokenizer is not None else _ids(event.token_ids) + " "
            out.write(piece)
            out.flush()
        elif event.token_ids:
            text = engine.tokenizer is not None
            shown = json.dumps(event.text) if text else _ids(event.token_ids)
            print(f"[{event.index}] + {shown}", file=out, flush=True)
        if event.result is not None:
            results[event.index] = event.result
    if single and not json_lines:
        print(file=out)
    return [results[index] for index in range(len(prompts))]


def print_result(index: int, result: GenerationResult, out: TextIO, *, json_lines: bool) -> None:
    """A prompt's output ids (and its text, with a tokenizer), or its ``result_json``."""
    if json_lines:
        print(json.dumps(result_json(index, result)), file=out)
        return
    print(f"[{index}] {_ids(result.output_ids)}  ({result.finish_reason.value})", file=out)
    if result.text is not None:
        print(f"[{index}] text: {json.dumps(result.text)}", file=out)


def result_json(index: int, result: GenerationResult) -> dict[str, Any]:
    """A result as plain JSON values (``--json``)."""
    timings = result.timings
    payload: dict[str, Any] = {
        "index": index,
        "prompt_ids": list(result.prompt_ids),
        "output_ids": result.output_ids,
        "text": result.text,
        "finish_reason": result.finish_reason.value,
        "timings": {
            "queue_s": timings.queue_s,
            "time_to_first_token_s": timings.time_to_first_token_s,
            "latency_s": timings.latency_s,
            "decode_tokens_per_s": timings.decode_tokens_per_s,
        },
        "num_retractions": result.num_retractions,
    }
    if result.acceptance is not None:
        payload["acceptance"] = {
            "mean_accept_length": result.acceptance.mean_accept_length,
            "histogram": list(result.acceptance.histogram),
        }
    return payload


def format_timings(index: int, result: GenerationResult) -> str:
    """One line of a request's timings (stderr)."""
    t = result.timings
    return (
        f"[{index}] {len(result.output_ids)} tokens ({result.finish_reason.value}): queued "
        f"{t.queue_s:.3f} s, first token {t.time_to_first_token_s:.3f} s, total "
        f"{t.latency_s:.3f} s, {t.decode_tokens_per_s:.1f} tok/s after the first"
    )


def print_summary(
    engine: Engine | DataParallelEngine,
    results: list[GenerationResult],
    elapsed: float,
    err: TextIO,
) -> None:
    """The run's tokens, rate, steps and (with speculation) its acceptance."""
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


def _ids(ids: list[int]) -> str:
    return " ".join(str(token) for token in ids)


def format_acceptance(acceptance: AcceptanceStats) -> str:
    """One line: the mean acceptance length and the histogram of tokens per verify step."""
    counts = ", ".join(
        f"{tokens}: {steps}" for tokens, steps in enumerate(acceptance.histogram) if steps
    )
    return (
        f"speculation: mean acceptance length {acceptance.mean_accept_length:.2f} tokens per "
        f"verify step over {acceptance.num_steps} steps; histogram (tokens: steps) {counts}"
    )


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
