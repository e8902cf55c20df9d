"""App: spawning a group of ranks, and reporting the rank that failed first.

``spawn_ranks`` runs a function in N spawned processes joined in one group (``process_group``).
Each rank records, before it exits, whether it finished or how it failed, with the time; the
parent names the first failure (``RankFailed``), a rank that died without a Python error before
the peers whose connections it closed, or the ranks still running at a deadline.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import (
    ProcessExitedException,
    ProcessRaisedException,
    start_processes,
)

from eagletree.app.parallel.process_group import (
    COLLECTIVE_TIMEOUT,
    free_port,
    join_process_group,
    leave_group,
)


class RankFailed(RuntimeError):
    """A rank of a spawned group raised; the others were ended. ``rank``: the first to fail."""

    def __init__(self, rank: int, world_size: int, error: str) -> None:
        super().__init__(f"rank {rank} of {world_size} failed first:\n{error}")
        self.rank = rank


def _rank_main(
    rank: int,
    main: Callable[..., None],
    world_size: int,
    port: int,
    timeout: datetime.timedelta,
    failures: Any,
    args: tuple[Any, ...],
) -> None:
    join_process_group(rank, world_size, port, timeout=timeout)
    try:
        main(rank, *args)
        # the marker tells a deadline which ranks only wait at the final barrier
        failures.put((time.time(), rank, None))
        leave_group(together=True)
    except SystemExit as exit_:  # a command's exit status; it printed its own message
        failures.put((time.time(), rank, f"exited with status {exit_.code}"))
        raise
    except BaseException:
        # recorded before this process exits: its peers' errors (a closed connection) follow it
        failures.put((time.time(), rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():  # this rank failed, or its final barrier did
            leave_group(together=False)


def spawn_ranks(
    main: Callable[..., None],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    timeout_s: float | None = 600.0,
    collective_timeout: datetime.timedelta = COLLECTIVE_TIMEOUT,
    stop_rank_0_on_signal: bool = False,
) -> None:
    """Run ``main(rank, *args)`` in ``world_size`` spawned processes joined in one group.

    ``main`` must be importable by name (spawn pickles it by reference). A rank that raises
    ends the others and this call raises ``RankFailed`` naming the rank that failed first, with
    its traceback; ranks still running after ``timeout_s`` (None: no deadline) are killed and
    ``TimeoutError`` names them. With ``stop_rank_0_on_signal`` (a server, whose rank 0 stops
    the group itself) SIGINT and SIGTERM to this process while it waits reach rank 0 as SIGINT;
    this must then be called from the main thread.
    """
    port = free_port()
    failures = mp.get_context("spawn").SimpleQueue()
    context = start_processes(  # type: ignore[no-untyped-call]
        _rank_main,
        args=(main, world_size, port, collective_timeout, failures, args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
    previous_handlers = _forward_stop_signals(context.processes[0]) if stop_rank_0_on_signal else {}
    try:
        while not context.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                done = set()
                while not failures.empty():
                    _, rank, trace = failures.get()
                    if trace is None:  # finished its work, waiting for the others to finish
                        done.add(rank)
                running = [
                    rank
                    for rank, p in enumerate(context.processes)
                    if p.is_alive() and rank not in done
                ]
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(
                    f"rank(s) {running} of {world_size} still running after {timeout_s} s; killed"
                )
    except (ProcessRaisedException, ProcessExitedException) as error:
        recorded = []
        while not failures.empty():
            event = failures.get()
            if event[2] is not None:  # a failure, not a rank's "finished" marker
                recorded.append(event)
        # a rank that died without a Python error (a signal, os._exit, the OOM killer) recorded
        # nothing; its peers' errors (a closed connection) are its consequence: it is named
        # (the peers the launcher ended exit by SIGTERM)
        reporting = {rank for _, rank, _ in recorded}
        for rank, process in enumerate(context.processes):
            code = process.exitcode
            if code not in (None, 0, -signal.SIGTERM) and rank not in reporting:
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                raise RankFailed(
                    rank, world_size, f"died without a Python error ({how})"
                ) from error
        if not recorded:
            raise
        _, rank, trace = min(recorded)
        raise RankFailed(rank, world_size, trace) from error
    finally:
        for number, handler in previous_handlers.items():
            signal.signal(number, handler)


def _forward_stop_signals(rank_0: Any) -> dict[int, Any]:
    """Send SIGINT and SIGTERM on to ``rank_0`` (a process) as SIGINT; the handlers replaced."""

    def forward(_number: int, _frame: object) -> None:
        if rank_0.is_alive():
            os.kill(rank_0.pid, signal.SIGINT)

    return {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
