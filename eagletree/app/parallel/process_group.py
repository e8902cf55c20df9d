"""App: joining the default process group, asking it who this rank is, and leaving it.

Joining is the launcher's business: ``torchrun`` (``join_launched_group``) or a spawning parent
(``join_process_group``), both rendezvousing on 127.0.0.1 with a timeout on every collective, so
that a dead rank ends the others with an error instead of a hang. A rank leaves by destroying
its groups before it exits (``leave_group``). The engine never uses the default group itself:
it gets explicit groups (``distributed.parallel_groups``).
"""

from __future__ import annotations

import datetime
import gc
import os
import random
import socket
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous or a server that
    binds it seconds later. Picked below the kernel's range of ephemeral ports where that range
    is known (Linux), so that no outgoing connection made meanwhile — the group's own gloo
    pairs, for one — can be given it first; elsewhere any port the kernel hands out."""
    low = ephemeral_port_range()[0]
    if low > 10_000:
        picker = random.SystemRandom()
        for _ in range(64):
            port = picker.randrange(10_000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        any_port: int = probe.getsockname()[1]
        return any_port


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections; (0, 0) where it is not known."""
    try:
        low, high = Path(EPHEMERAL_RANGE_FILE).read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 0, 0


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

    Destroying unregisters the groups; the objects holding them (an engine's layers and
    workers, which reference each other) are freed by the garbage collector, so it runs here:
    left to the interpreter's last collection, their gloo teardown ran while it was shutting
    down and aborted both ranks of a finished ``--dp 2`` run.
    """
    if together:
        dist.barrier()
    dist.destroy_process_group()
    gc.collect()


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
