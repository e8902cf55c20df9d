"""App: the process groups of tensor and data parallelism, and joining and spawning them.

Every rank of a tensor-parallel group builds the same engine from the same settings and is
given the same requests in the same order; the scheduler is deterministic and the sampling
coins are a function of (seed, position), and every collective hands all ranks one result, so
each rank's scheduler, worker and acceptance stay identical without broadcasting a plan. Rank 0
is the one that reports. A sampling request needs the same seed on every rank: a request
without one draws it from the process's entropy, so a launcher seeds them (``agreed_seed``).

Data-parallel replicas are different: each serves its own requests, in lockstep with the
others (``app/data_parallel.py``), over a group of its own.

The default process group is torch.distributed's global state; the engine never uses it, it
gets explicit groups (``parallel_groups``), the tensor-parallel one of which the container wraps
in the models' ``TensorParallel`` value. Joining
(``join_process_group``) is the launcher's business: ``torchrun`` or a spawning parent, both
rendezvousing on 127.0.0.1 with a timeout on every collective, so that a dead rank ends the
others with an error instead of a hang.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import (
    ProcessExitedException,
    ProcessRaisedException,
    start_processes,
)

from eagletree.domain.errors import ConfigurationError

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a spawned group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def join_process_group(
    rank: int,
    world_size: int,
    port: int,
    backend: str | None = None,
    timeout: datetime.timedelta = COLLECTIVE_TIMEOUT,
) -> None:
    """Join the default group of ``world_size`` processes on 127.0.0.1:``port`` (gloo on the
    CPU, NCCL when CUDA is there); every collective fails after ``timeout`` instead of hanging."""
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    _use_rank_gpu(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )


def launched_by_torchrun() -> bool:
    """Whether this process is a rank torchrun started (its rendezvous is in the environment)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def join_launched_group(timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> None:
    """Join the group torchrun launched (``env://``), with the same collective timeout."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    _use_rank_gpu(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    dist.init_process_group(backend, timeout=timeout)


def leave_group(*, together: bool) -> None:
    """Destroy every process group this rank made, the default one last, before it exits.

    A process that exits with its groups alive leaves their gloo contexts and worker threads to
    the interpreter's finalization, which aborts it now and then ("terminate called without an
    active exception", SIGABRT). With ``together`` (this rank finished its work) it first waits
    at a barrier until every rank has: a rank tearing its gloo pairs down while a peer still
    talks over them aborts that peer the same way. After a failure there is no barrier (the
    peers may be gone, or waiting in a collective that will never match it).
    """
    if together:
        dist.barrier()
    dist.destroy_process_group()


def run_in_launched_group(work: Callable[[], int]) -> int:
    """Join torchrun's group, run ``work`` (this rank's exit status), then leave the group:
    together once it returned 0, alone after a failure."""
    join_launched_group()
    status = 1
    try:
        status = work()
    finally:
        leave_group(together=status == 0)
    return status


def _use_rank_gpu(local_rank: int) -> None:
    # NCCL communicators and Triton launches use the current device: make it the rank's own
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def in_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_rank() -> int:
    """This process's rank in the joined group; 0 outside one."""
    return dist.get_rank() if in_process_group() else 0


def barrier() -> None:
    """Wait until every rank of the joined group gets here."""
    dist.barrier()


def agreed_seed() -> int:
    """A fresh random seed, the same on every rank (rank 0's, broadcast): an unseeded sampling
    request draws its seed from this process's entropy, which the ranks would not share."""
    seed = [int.from_bytes(os.urandom(4), "little")]
    dist.broadcast_object_list(seed, src=0)
    return int(seed[0])


@dataclass(frozen=True, slots=True)
class ParallelGroups:
    """This rank's place in a ``dp_size`` × ``tp_size`` group: global rank
    ``dp_rank · tp_size + tp_rank``. ``tp_group`` (None for one rank) holds the ``tp_size``
    ranks its models are sharded over, ``dp_group`` (None for one) the ``dp_size`` ranks of its
    tensor-parallel rank across the data-parallel replicas (gloo: host values), and
    ``dense_group`` the same ranks on the device's backend, for the dense layers sharded over
    them (None unless asked for)."""

    tp_rank: int = 0
    tp_size: int = 1
    tp_group: dist.ProcessGroup | None = None
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: dist.ProcessGroup | None = None
    dense_group: dist.ProcessGroup | None = None


def parallel_groups(
    tp_size: int,
    dp_size: int,
    dense_over_dp: bool = False,
    timeout: datetime.timedelta = COLLECTIVE_TIMEOUT,
) -> ParallelGroups:
    """The tensor- and data-parallel groups over the (already joined) default group of
    ``tp_size · dp_size`` ranks; no group at all for one rank; with ``dense_over_dp`` (and
    dp_size > 1) also the data-parallel ranks' device-backend group. Every rank must call it
    (each ``new_group`` is a collective of the whole world, made in the same order everywhere)."""
    world = tp_size * dp_size
    if world == 1:
        return ParallelGroups()
    if not in_process_group():
        raise ConfigurationError(
            f"parallel.tp_size = {tp_size} × parallel.dp_size = {dp_size} needs {world} "
            f"processes: launch them with torchrun --nproc-per-node {world}, or join them "
            "with eagletree.app.distributed.join_process_group before building the engine"
        )
    world_size = dist.get_world_size()
    if world_size != world:
        raise ConfigurationError(
            f"parallel.tp_size = {tp_size} × parallel.dp_size = {dp_size} = {world} ranks, "
            f"but the process group has {world_size}: launch exactly tp_size · dp_size processes"
        )
    dp_rank, tp_rank = divmod(dist.get_rank(), tp_size)
    tp_group = dp_group = dense_group = None
    if tp_size > 1:
        for replica in range(dp_size):
            group = dist.new_group([replica * tp_size + t for t in range(tp_size)], timeout=timeout)
            if replica == dp_rank:
                tp_group = group
    if dp_size > 1:
        for shard in range(tp_size):
            # host values only (loads, counters, results): gloo, also beside NCCL
            group = dist.new_group(
                [replica * tp_size + shard for replica in range(dp_size)],
                timeout=timeout,
                backend="gloo",
            )
            if shard == tp_rank:
                dp_group = group
    for shard in range(tp_size if dense_over_dp and dp_size > 1 else 0):
        ranks = [replica * tp_size + shard for replica in range(dp_size)]
        group = dist.new_group(ranks, timeout=timeout)
        if shard == tp_rank:
            dense_group = group
    return ParallelGroups(tp_rank, tp_size, tp_group, dp_rank, dp_size, dp_group, dense_group)


def world_size() -> int:
    """The joined group's size; 1 outside one."""
    return dist.get_world_size() if in_process_group() else 1


def rank_device(device: str, rank: int, world_size: int) -> torch.device:
    """``device`` for this rank: a bare ``cuda`` becomes the rank's GPU (LOCAL_RANK under
    torchrun, else the rank); an explicit index or another device stays as it is."""
    chosen = torch.device(device)
    if chosen.type != "cuda" or chosen.index is not None or world_size == 1:
        return chosen
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))


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
