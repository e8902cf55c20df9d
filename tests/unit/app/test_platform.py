"""Resolving "auto" settings for the machine, and the contradictions that are errors."""

from __future__ import annotations

from typing import Any

import pytest

from eagletree.app.composition.platform import (
    Platform,
    cpu_threads,
    resolve_cpu_threads,
    resolve_platform,
)
from eagletree.config.cuda_graphs import ResolvedCudaGraphs, resolve_cuda_graphs
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError

CPU = Platform(cuda_device_count=0, triton_interpreted=False)
CPU_INTERPRETED = Platform(cuda_device_count=0, triton_interpreted=True)
ONE_GPU = Platform(cuda_device_count=1, triton_interpreted=False)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)


def resolved(platform: Platform, **sections: Any) -> tuple[str, str, str, str, str]:
    settings = resolve_platform(EngineSettings(**sections), platform)
    model, backend = settings.model, settings.backend
    return model.device, model.dtype, backend.attention, backend.kv_move, backend.cuda_graph


def test_auto_is_cuda_bf16_triton_and_graphs_with_a_gpu() -> None:
    assert resolved(ONE_GPU) == ("cuda", "bfloat16", "triton", "triton", "on")


def test_debug_checks_keep_auto_graphs_off_and_contradict_graphs_on() -> None:
    checked = {"memory": {"debug_checks": True}}
    assert resolved(ONE_GPU, **checked)[4] == "off"
    on = resolve_platform(EngineSettings(**checked, backend={"cuda_graph": "on"}), ONE_GPU)
    with pytest.raises(ConfigurationError, match=r"memory\.debug_checks reads device values"):
        resolve_cuda_graphs(on, "cuda", "eagle_v2")
    decided = resolve_cuda_graphs(resolve_platform(EngineSettings(), ONE_GPU), "cuda", "eagle_v2")
    assert decided == ResolvedCudaGraphs(True, None)


def test_dense_layers_sharded_over_replicas_keep_auto_graphs_off_and_contradict_on() -> None:
    dense = {"parallel": {"dp_size": 2, "shard_dense_over_dp": True}}
    assert resolved(ONE_GPU, **dense)[4] == "off"
    assert resolved(ONE_GPU, parallel={"shard_dense_over_dp": True})[4] == "on"  # one replica
    on = resolve_platform(EngineSettings(**dense, backend={"cuda_graph": "on"}), ONE_GPU)
    with pytest.raises(ConfigurationError, match=r"shard_dense_over_dp exchanges the ranks' row"):
        resolve_cuda_graphs(on, "cuda", "eagle_v2")


def test_auto_is_cpu_fp32_torch_without_graphs_without_one() -> None:
    assert resolved(CPU) == ("cpu", "float32", "torch", "torch", "off")
    assert resolved(CPU_INTERPRETED) == ("cpu", "float32", "torch", "torch", "off")


def test_explicit_values_are_kept() -> None:
    chosen = resolved(
        ONE_GPU,
        model={"device": "cpu", "dtype": "bfloat16"},
        backend={"attention": "torch", "kv_move": "torch", "cuda_graph": "off"},
    )
    assert chosen == ("cpu", "bfloat16", "torch", "torch", "off")
    assert resolved(ONE_GPU, model={"device": "cuda:0"})[0] == "cuda:0"


def test_triton_on_the_cpu_runs_only_under_the_interpreter() -> None:
    backend = {"attention": "triton", "kv_move": "triton"}
    assert resolved(CPU_INTERPRETED, backend=backend)[2:4] == ("triton", "triton")
    with pytest.raises(ConfigurationError, match=r"backend\.attention = 'triton' with model"):
        resolved(CPU, backend={"attention": "triton"})
    with pytest.raises(ConfigurationError, match=r"set backend\.kv_move = 'auto' or 'torch'"):
        resolved(CPU, backend={"kv_move": "triton"})


@pytest.mark.parametrize(
    ("platform", "sections", "message"),
    [
        (CPU, {"model": {"device": "cuda"}}, "no CUDA device is visible"),
        (ONE_GPU, {"model": {"device": "cuda:1"}}, r"only 1 CUDA device\(s\)"),
        (CPU_INTERPRETED, {"backend": {"attention": "flash"}}, "FlashAttention runs on CUDA"),
        (CPU, {"backend": {"cuda_graph": "on"}}, r"backend\.cuda_graph = 'on' with model"),
        (ONE_GPU, {"model": {"device": "cpu"}, "backend": {"cuda_graph": "on"}}, "CUDA graphs"),
    ],
)
def test_contradictions_name_the_setting(
    platform: Platform, sections: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        resolved(platform, **sections)


def test_resolving_twice_changes_nothing() -> None:
    once = resolve_platform(EngineSettings(), CPU)
    assert resolve_platform(once, CPU) == once


def test_small_models_run_on_one_cpu_thread_and_large_ones_on_more() -> None:
    assert cpu_threads(hidden_size=64, cpu_count=2) == 1
    assert cpu_threads(hidden_size=4096, cpu_count=2) == 2
    assert cpu_threads(hidden_size=4096, cpu_count=16) == 4


def _threads(
    hidden_size: int = 64, omp: str | None = None, **backend: Any
) -> tuple[int | None, str, list[int]]:
    reads: list[int] = []

    def hidden() -> int:
        reads.append(hidden_size)
        return hidden_size

    settings = resolve_platform(EngineSettings(backend=backend), CPU)
    decision = resolve_cpu_threads(settings, hidden, cpu_count=2, omp_num_threads=omp)
    return decision.count, decision.reason, reads


def test_the_thread_policy_gives_a_small_cpu_model_one_thread() -> None:
    count, reason, reads = _threads(hidden_size=64)
    assert count == 1 and reads == [64]
    assert "one per 1024 of the target's 64 hidden units" in reason


def test_omp_num_threads_is_kept_when_the_setting_is_auto() -> None:
    count, reason, reads = _threads(omp="2")
    assert count is None and "OMP_NUM_THREADS=2" in reason and reads == []


def test_the_setting_wins_over_omp_num_threads_and_the_model_size() -> None:
    count, reason, reads = _threads(hidden_size=8192, omp="1", cpu_threads=2)
    assert count == 2 and reason == "backend.cpu_threads = 2" and reads == []


def test_an_engine_on_cuda_leaves_the_threads_alone() -> None:
    settings = resolve_platform(EngineSettings(), ONE_GPU)
    decision = resolve_cpu_threads(settings, lambda: 64, cpu_count=2, omp_num_threads=None)
    assert decision.count is None and "'cuda'" in decision.reason
