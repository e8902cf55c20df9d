"""Configuration: whether the engine runs one step ahead of the host, decided once and explained.

``scheduler.overlap = "auto"`` overlaps where it pays: the v2 and multi-layer MTP v2 workers,
whose steps take their lengths from the device, and the plain worker (``"none"``), whose steps
take each request's pending token from the device and whose lengths the host knows (one token a
step), on a CUDA device. The CPU runs a step to its end before returning, so there is nothing
to overlap there unless asked for (``"on"``, which the tests use: outputs are identical either
way). The v1 worker frees rejected draft slots from each step's accept lengths on the host, so
it runs synchronously and ``"on"`` is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagletree.config.eagle_hook import WorkerName
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError

OVERLAP_WORKERS: frozenset[WorkerName] = frozenset({"none", "eagle_v2", "multi_layer_eagle_v2"})

_WHY_NOT: dict[str, str] = {
    "eagle_v1": "the eagle_v1 worker frees rejected draft slots from each step's accept lengths "
    "on the host, so it needs them before the next step",
}


@dataclass(frozen=True, slots=True)
class ResolvedOverlap:
    """``enabled`` and, when it is not, why (None when the settings turned overlap off)."""

    enabled: bool
    reason: str | None


def resolve_overlap(
    settings: EngineSettings, device_type: str, worker: WorkerName
) -> ResolvedOverlap:
    """Apply the rules above for a model on ``device_type`` ("cuda", "cpu", …) run by ``worker``."""
    wanted = settings.scheduler.overlap
    if wanted == "off":
        return ResolvedOverlap(False, None)
    if worker not in OVERLAP_WORKERS:
        reason = _WHY_NOT.get(worker, f"the {worker} worker keeps host books every step")
        if wanted == "on":
            raise ConfigurationError(
                f"scheduler.overlap = 'on' cannot be kept: {reason}; set scheduler.overlap to "
                "'auto' or 'off', or speculative.version to 'v2'"
            )
        return ResolvedOverlap(False, reason)
    if wanted == "auto" and device_type != "cuda":
        return ResolvedOverlap(
            False,
            f"model.device is {device_type!r}: a CPU step is done when it returns, so there is "
            "nothing to overlap (scheduler.overlap = 'on' runs it anyway)",
        )
    return ResolvedOverlap(True, None)
