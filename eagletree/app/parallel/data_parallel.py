"""App: data-parallel engines — each rank owns its requests; the group steps in lockstep.

Every rank of a data-parallel group holds a whole ``Engine`` (scheduler, KV pools, draft state,
and a full copy of the weights, or its tensor-parallel shard of them, or with
``parallel.shard_dense_over_dp`` 1/dp of the dense layers) and serves only the requests the
router placed on it; its attention reads only its own KV pool. The group steps in lockstep:
before every step one all-reduce of a few counters tells each rank whether any rank still has
work, and a rank without requests then runs its worker's idle step (bs == 0) through every
phase. So the group finishes together, and every rank makes the same sequence of collectives,
which the dense layers sharded over the group need (with the phases agreed inside each step:
``app/engine/phases.py``).

The group exchanges host values only (loads, counters, results): it is a gloo group also when
the models' collectives run on NCCL, so the exchanges never wait on the device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar, cast

import torch
import torch.distributed as dist

from eagletree.app.engine.generation import PromptBatch, checked_requests
from eagletree.app.engine.reports import EngineStats, GenerationResult, StepReport
from eagletree.app.parallel.router import load_of, route_by_load
from eagletree.domain.request import RequestStatus

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine
    from eagletree.app.engine.prompts import Prompt
    from eagletree.app.parallel.distributed import ParallelGroups
    from eagletree.domain.request import Request
    from eagletree.ports.tokenizer import Tokenizer

_Value = TypeVar("_Value")


class DataParallelEngine:
    """The data-parallel rank ``groups.dp_rank`` of ``groups.dp_size``, around its own
    ``engine``. Every rank of the group calls ``generate`` with the same prompts; each returns
    every prompt's result, in prompt order."""

    def __init__(self, engine: Engine, groups: ParallelGroups) -> None:
        self.engine = engine
        self.groups = groups
        self.rank = groups.dp_rank
        self.size = groups.dp_size
        self._group = groups.dp_group
        self.stats = EngineStats()  # the group's, summed over its ranks after each generate

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token_ids: Collection[int] | None = None,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> list[GenerationResult]:
        """``Engine.generate`` over the group: the same arguments on every rank, the same
        results (in prompt order) back on every rank; ``on_step`` sees the group's counts.

        Every rank checks every prompt first, so a bad one raises the same ValueError on all
        of them before anything is queued. With ``seed`` prompt i samples with ``seed + i`` on
        whichever rank it runs, as in one process. A result's ``request_id`` is its id in the
        engine of the rank that ran it.
        """
        batch = PromptBatch(
            prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids
        )
        checked = checked_requests(self.engine, batch)
        placement = route_by_load([len(ids) for ids, _ in checked], self._loads())
        mine = {
            index: self.engine.submit(*checked[index])
            for index, rank in enumerate(placement)
            if rank == self.rank
        }
        stats_before = dataclasses.replace(
            self.engine.stats, emitted_per_step=list(self.engine.stats.emitted_per_step)
        )
        started = time.perf_counter()
        num_steps = 0
        while True:
            counts = self._group_counts(list(mine.values()), stats_before)
            if num_steps and on_step is not None:
                running, waiting, generated, finished = counts[1:]
                elapsed_s = time.perf_counter() - started
                on_step(StepReport(num_steps, running, waiting, generated, finished, elapsed_s))
            if counts[0] == 0:  # no rank has an unfinished request: the group ends together
                break
            self.engine.step(run_idle=True)
            num_steps += 1
        local = {index: self.engine.result_of(request) for index, request in mine.items()}
        gathered = self._all_gather((local, _stats_since(stats_before, self.engine.stats)))
        results: dict[int, GenerationResult] = {}
        for rank_results, _ in gathered:
            results.update(rank_results)
        self.stats = _merged([rank_stats for _, rank_stats in gathered], into=self.stats)
        return [results[index] for index in range(len(checked))]

    def _loads(self) -> list[int]:
        """Every rank's tokens now (its running and waiting requests), by rank."""
        return [int(value) for value in self._all_gather(load_of(self.engine.scheduler))]

    def _group_counts(self, requests: list[Request], before: EngineStats) -> list[int]:
        """Summed over the group: [unfinished requests of this call, running, waiting,
        tokens generated in this call, requests of this call finished]."""
        unfinished = sum(r.status is not RequestStatus.FINISHED for r in requests)
        scheduler = self.engine.scheduler
        counts = torch.tensor(
            [
                unfinished,
                len(scheduler.running),
                len(scheduler.waiting),
                self.engine.stats.num_generated_tokens - before.num_generated_tokens,
                len(requests) - unfinished,
            ],
            dtype=torch.int64,
        )
        if self._group is not None:
            # SYNC: a host exchange with every rank, once a step: the lockstep itself
            dist.all_reduce(counts, group=self._group)
        return [int(value) for value in counts.tolist()]

    def _all_gather(self, value: _Value) -> list[_Value]:
        """Every rank's ``value``, by rank (pickled through the group)."""
        if self._group is None:
            return [value]
        gathered: list[_Value | None] = [None] * self.size
        dist.all_gather_object(gathered, value, group=self._group)
        return cast("list[_Value]", gathered)  # every rank's slot filled

    def close(self) -> None:
        """Abort what this rank's engine still holds (no collective)."""
        self.engine.close()

    def __enter__(self) -> DataParallelEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _stats_since(before: EngineStats, after: EngineStats) -> EngineStats:
    """The counters ``after`` gained since ``before`` (``emitted_per_step``: the new entries)."""
    gained = {
        f.name: getattr(after, f.name) - getattr(before, f.name)
        for f in dataclasses.fields(EngineStats)
        if f.name != "emitted_per_step"
    }
    return EngineStats(
        **gained, emitted_per_step=after.emitted_per_step[len(before.emitted_per_step) :]
    )


def _merged(per_rank: Sequence[EngineStats], into: EngineStats) -> EngineStats:
    """``into`` plus the ranks' counters: summed, but steps and busy time once (the ranks step
    in lockstep: their largest)."""
    merged = dataclasses.replace(into, emitted_per_step=list(into.emitted_per_step))
    for f in dataclasses.fields(EngineStats):
        name = f.name
        if name == "emitted_per_step":
            for stats in per_rank:
                merged.emitted_per_step.extend(stats.emitted_per_step)
        elif name in ("num_steps", "busy_s"):
            setattr(merged, name, getattr(into, name) + max(getattr(s, name) for s in per_rank))
        else:
            setattr(merged, name, getattr(into, name) + sum(getattr(s, name) for s in per_rank))
    return merged
