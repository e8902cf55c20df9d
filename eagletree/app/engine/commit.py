"""App: a read step applied to its requests — tokens, stops, KV commits — and counted in the stats.

``StepPipeline.read`` calls ``commit_step`` for the step it reads (with overlap, the one
launched by the engine's previous step); ``Engine.step`` calls ``count_step`` once per call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from operator import itemgetter
from typing import TYPE_CHECKING

from eagletree.app.engine.worker import ReadRows
from eagletree.domain.request import FinishReason

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.app.engine.reports import EngineStats
    from eagletree.app.engine.transfers import PendingStep
    from eagletree.domain.request import Request


def commit_step(
    pending: PendingStep,
    eos_token_ids: Collection[int],
    clock: Callable[[], float],
    stats: EngineStats,
) -> None:
    """Append the step's tokens, apply EOS / stop / length; drop those of requests that
    finished since it was launched (it ran ahead of their last token).

    ``clock`` is read once the step's values are on the host: that instant is the requests'
    first-token time."""
    output = pending.output
    rows = pending.rows()
    now = clock()
    width = output.tokens.shape[1]
    num_prefill, speculative = output.num_prefill, output.speculative
    generated = 0
    for index, (request, row) in enumerate(zip(output.requests, rows, strict=True)):
        if request.finish_reason is not None:  # finished, aborted or released meanwhile
            continue
        num_emitted, num_committed = row[width], row[width + 1]
        if index < num_prefill:  # its KV was committed at launch
            num_committed = 0
        elif speculative:
            request.emitted_per_step.append(num_emitted)
        generated += request.append_tokens(row[:num_emitted], eos_token_ids, now)
        # a path cut at EOS or max_new_tokens commits no KV past the request's last token
        request.commit(min(num_committed, request.num_tokens - request.committed_len))
    stats.num_generated_tokens += generated
    stats.num_forwards += output.num_forwards
    if output.observer is not None:  # requests finished meanwhile still tell what was accepted
        decode = slice(output.num_prefill, None)
        # each decode row from its counts on: the observer may learn from them alone
        output.observer(
            output.requests[decode], ReadRows(rows[decode], itemgetter(slice(width, None)))
        )


def count_step(
    stats: EngineStats,
    plan: SchedulePlan,
    finished: list[Request],
    started: float,
    clock: Callable[[], float],
) -> None:
    """Count one ``Engine.step`` call that began at ``started`` and released ``finished``."""
    stats.num_steps += 1
    stats.num_prefill_only_steps += bool(plan.prefill) and not plan.decode
    stats.num_retracted += len(plan.retracted)
    stats.num_finished += len(finished)
    stats.num_aborted += sum(r.finish_reason is FinishReason.ABORT for r in finished)
    for request in finished:
        stats.emitted_per_step.extend(request.emitted_per_step)
    stats.busy_s += clock() - started
