"""Configuration: whether decode steps run from CUDA graphs, decided once and explained.

``backend.cuda_graph = "auto"`` captures wherever it can and says why where it cannot; ``"on"``
is a promise the settings must keep, so a contradiction is an error naming the setting to
change; ``"off"`` never captures. What a graph needs: a CUDA device, an attention backend whose
launches do not depend on host copies of the lengths (Triton: the torch and flash backends size
their work from ``seq_lens_cpu``), no host checks inside a step (``memory.debug_checks`` off),
and a worker whose decode step is one device function (the plain, v2 and multi-layer MTP v2
workers; v1 keeps host books every step), and no dense layers sharded over the data-parallel
ranks (their row counts are exchanged on the host per forward).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagletree.config.eagle_hook import WorkerName
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError

GRAPH_WORKERS: frozenset[WorkerName] = frozenset({"none", "eagle_v2", "multi_layer_eagle_v2"})


@dataclass(frozen=True, slots=True)
class ResolvedCudaGraphs:
    """``enabled`` and, when it is not, why (None when the settings turned graphs off)."""

    enabled: bool
    reason: str | None


def resolve_cuda_graphs(
    settings: EngineSettings, device_type: str, worker: WorkerName
) -> ResolvedCudaGraphs:
    """Apply the rules above for a model on ``device_type`` ("cuda", "cpu", …) run by ``worker``."""
    wanted = settings.backend.cuda_graph
    if wanted == "off":
        return ResolvedCudaGraphs(False, None)
    problems = []
    if device_type != "cuda":
        problems.append(f"model.device is {device_type!r}, not a CUDA device")
    if settings.backend.attention != "triton":
        problems.append(
            f"backend.attention = {settings.backend.attention!r} sizes its launches from host "
            "lengths (use 'triton')"
        )
    if settings.memory.debug_checks:
        problems.append("memory.debug_checks reads device values on the host inside a step")
    if worker not in GRAPH_WORKERS:
        problems.append(f"the {worker} worker runs its decode steps eagerly")
    if settings.parallel.shard_dense_over_dp and settings.parallel.dp_size > 1:
        problems.append(
            "parallel.shard_dense_over_dp exchanges the ranks' row counts on the host in "
            "every forward"
        )
    if not problems:
        return ResolvedCudaGraphs(True, None)
    reason = "; ".join(problems)
    if wanted == "on" and worker in GRAPH_WORKERS:
        raise ConfigurationError(
            f"backend.cuda_graph = 'on' cannot be kept: {reason}; set backend.cuda_graph to "
            "'auto' or 'off'"
        )
    return ResolvedCudaGraphs(False, reason)
