"""scheduler.overlap: on for the v2 and plain workers on CUDA, off (with the reason) elsewhere."""

from __future__ import annotations

import pytest

from eagletree.config.eagle_hook import WorkerName
from eagletree.config.overlap import OVERLAP_WORKERS, ResolvedOverlap, resolve_overlap
from eagletree.config.sections import SchedulerSettings
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError

WORKERS: list[WorkerName] = ["none", "eagle_v1", "eagle_v2", "multi_layer_eagle_v2"]


def settings(overlap: str) -> EngineSettings:
    return EngineSettings(scheduler=SchedulerSettings(overlap=overlap))  # type: ignore[arg-type]


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_auto_overlaps_the_v2_and_plain_workers_on_cuda_only_and_says_why_not(
    worker: WorkerName, device: str
) -> None:
    resolved = resolve_overlap(settings("auto"), device, worker)
    expected = worker in ("none", "eagle_v2", "multi_layer_eagle_v2") and device == "cuda"
    assert resolved.enabled is expected
    assert (resolved.reason is None) is expected
    if worker == "eagle_v1":
        assert resolved.reason is not None and "accept lengths" in resolved.reason
    elif not expected and worker in OVERLAP_WORKERS:
        assert resolved.reason is not None and "'cpu'" in resolved.reason


@pytest.mark.parametrize("worker", sorted(OVERLAP_WORKERS))
def test_on_is_kept_for_the_overlapping_workers_even_on_the_cpu(worker: WorkerName) -> None:
    assert resolve_overlap(settings("on"), "cpu", worker).enabled


def test_on_for_the_synchronous_v1_worker_is_an_error_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"scheduler\.overlap = 'on' cannot be kept"):
        resolve_overlap(settings("on"), "cuda", "eagle_v1")


@pytest.mark.parametrize("worker", WORKERS)
def test_off_is_off_without_a_reason(worker: WorkerName) -> None:
    assert resolve_overlap(settings("off"), "cuda", worker) == ResolvedOverlap(False, None)
