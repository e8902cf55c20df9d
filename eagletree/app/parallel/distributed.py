"""App: the process groups of tensor and data parallelism, and joining and spawning them.

Every rank of a tensor-parallel group builds the same engine from the same settings and is
given the same requests in the same order; the scheduler is deterministic and the sampling
coins are a function of (seed, position), and every collective hands all ranks one result, so
each rank's scheduler, worker and acceptance stay identical without broadcasting a plan. Rank 0
is the one that reports. A sampling request needs the same seed on every rank: a request
without one draws it from the process's entropy, so a launcher seeds them (``agreed_seed``).

Data-parallel replicas are different: each serves its own requests, in lockstep with the
others (``app/parallel/data_parallel.py``), over a group of its own.

The default process group is torch.distributed's global state; the engine never uses it, it
gets explicit groups (``parallel_groups``, made here), the tensor-parallel one of which the
container wraps in the models' ``TensorParallel`` value. Joining and leaving the default group
live in ``process_group``, spawning ranks and reporting their failures in ``spawned_group``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from eagletree.app.parallel.process_group import (
    COLLECTIVE_TIMEOUT,
    in_process_group,
)
from eagletree.domain.errors import ConfigurationError


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


def check_world(tp_size: int, dp_size: int) -> None:
    """Raise ConfigurationError unless this process is one of a joined group of exactly
    ``tp_size · dp_size`` ranks (nothing to check for one rank)."""
    world = tp_size * dp_size
    if world == 1:
        return
    if not in_process_group():
        raise ConfigurationError(
            f"parallel.tp_size = {tp_size} × parallel.dp_size = {dp_size} needs {world} "
            f"processes: launch them with torchrun --nproc-per-node {world}, or join them "
            "with eagletree.app.parallel.distributed.join_process_group before building the engine"
        )
    world_size = dist.get_world_size()
    if world_size != world:
        raise ConfigurationError(
            f"parallel.tp_size = {tp_size} × parallel.dp_size = {dp_size} = {world} ranks, "
            f"but the process group has {world_size}: launch exactly tp_size · dp_size processes"
        )


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
    if tp_size * dp_size == 1:
        return ParallelGroups()
    check_world(tp_size, dp_size)
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
