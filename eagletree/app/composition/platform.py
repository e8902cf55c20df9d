"""Platform: the "auto" settings resolved for the machine (device, dtype, backends, graphs).

``resolve_platform`` returns settings with every "auto" device, dtype and backend made concrete,
so that ``config show`` prints exactly what ``build_engine`` builds. The CPU thread policy,
applied by ``build_engine`` and everything built on it, is here too. An explicit choice that
the machine cannot run is a ConfigurationError naming the setting, never a silent change.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.config.settings import EngineSettings


@dataclass(frozen=True, slots=True)
class Platform:
    """What the resolution needs to know about the machine."""

    cuda_device_count: int
    triton_interpreted: bool  # TRITON_INTERPRET=1: Triton kernels run on the CPU (tests)

    @staticmethod
    def detect() -> Platform:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return Platform(count, os.environ.get("TRITON_INTERPRET") == "1")


def resolve_platform(settings: EngineSettings, platform: Platform | None = None) -> EngineSettings:
    """``settings`` with model.device, model.dtype, backend.attention, backend.kv_move and
    backend.cuda_graph concrete: CUDA when visible, else the CPU; bfloat16 on CUDA, float32 on
    the CPU; Triton on CUDA, torch on the CPU; CUDA graphs on for CUDA with Triton attention
    (and no ``memory.debug_checks``, whose host reads a graph cannot replay, nor dense layers
    sharded over the data-parallel ranks, whose row counts are exchanged on the host)."""
    platform = Platform.detect() if platform is None else platform
    model, backend = settings.model, settings.backend
    device = _device(model.device, platform)
    on_cuda = device.startswith("cuda")
    dtype = model.dtype if model.dtype != "auto" else ("bfloat16" if on_cuda else "float32")
    attention = backend.attention if backend.attention != "auto" else _kernel_default(on_cuda)
    kv_move = backend.kv_move if backend.kv_move != "auto" else _kernel_default(on_cuda)
    # auto: on where a graph can be captured (the rest of the rules: config/cuda_graphs.py)
    cuda_graph = backend.cuda_graph
    if cuda_graph == "auto":
        parallel = settings.parallel
        dense_over_dp = parallel.shard_dense_over_dp and parallel.dp_size > 1
        capturable = on_cuda and attention == "triton" and not settings.memory.debug_checks
        cuda_graph = "on" if capturable and not dense_over_dp else "off"
    if not on_cuda:
        triton_hint = (
            "Triton runs on CUDA (on the CPU only under TRITON_INTERPRET=1, for tests): set {} = "
            "'auto' or 'torch', or model.device = 'cuda' on a machine with CUDA"
        )
        if attention == "triton" and not platform.triton_interpreted:
            raise ConfigurationError(
                f"backend.attention = 'triton' with model.device = {device!r}: "
                + triton_hint.format("backend.attention")
            )
        if kv_move == "triton" and not platform.triton_interpreted:
            raise ConfigurationError(
                f"backend.kv_move = 'triton' with model.device = {device!r}: "
                + triton_hint.format("backend.kv_move")
            )
        if attention == "flash":
            raise ConfigurationError(
                f"backend.attention = 'flash' with model.device = {device!r}: FlashAttention "
                "runs on CUDA only; set backend.attention = 'auto' or 'torch'"
            )
        if cuda_graph == "on":
            raise ConfigurationError(
                f"backend.cuda_graph = 'on' with model.device = {device!r}: CUDA graphs need a "
                "CUDA device; set backend.cuda_graph = 'auto' or 'off'"
            )
    return settings.model_copy(
        update={
            "model": model.model_copy(update={"device": device, "dtype": dtype}),
            "backend": backend.model_copy(
                update={"attention": attention, "kv_move": kv_move, "cuda_graph": cuda_graph}
            ),
        }
    )


def _kernel_default(on_cuda: bool) -> str:
    return "triton" if on_cuda else "torch"


def _device(name: str, platform: Platform) -> str:
    if name == "auto":
        return "cuda" if platform.cuda_device_count else "cpu"
    if name.startswith("cuda"):
        if platform.cuda_device_count == 0:
            raise ConfigurationError(
                f"model.device = {name!r} but no CUDA device is visible: set model.device = "
                "'auto' or 'cpu'"
            )
        index = int(name.partition(":")[2] or 0)
        if index >= platform.cuda_device_count:
            raise ConfigurationError(
                f"model.device = {name!r} but only {platform.cuda_device_count} CUDA device(s) "
                f"are visible (cuda:0 to cuda:{platform.cuda_device_count - 1})"
            )
    return name


def cpu_threads(hidden_size: int, cpu_count: int) -> int:
    """Torch intra-op threads for a CPU model of ``hidden_size``: small matrices gain nothing
    from threads that spin against each other, so one thread per 1024 hidden units."""
    return max(1, min(cpu_count, hidden_size // 1024))


@dataclass(frozen=True, slots=True)
class CpuThreads:
    """The thread policy's decision for one engine."""

    count: int | None  # None: torch's own count is left as it is
    reason: str


def resolve_cpu_threads(
    settings: EngineSettings,
    hidden_size: Callable[[], int],
    cpu_count: int,
    omp_num_threads: str | None,
) -> CpuThreads:
    """The one thread policy: an engine on the CPU runs ``backend.cpu_threads`` threads; "auto"
    keeps OMP_NUM_THREADS when it is set, else ``cpu_threads`` for the target's hidden size
    (read only then). An engine on CUDA leaves torch's threads alone."""
    if settings.model.device != "cpu":
        return CpuThreads(None, f"model.device = {settings.model.device!r}: left as they are")
    setting = settings.backend.cpu_threads
    if setting != "auto":
        return CpuThreads(setting, f"backend.cpu_threads = {setting}")
    if omp_num_threads:
        return CpuThreads(None, f"OMP_NUM_THREADS={omp_num_threads} (backend.cpu_threads auto)")
    hidden = hidden_size()
    return CpuThreads(
        cpu_threads(hidden, cpu_count),
        f"backend.cpu_threads auto: one per 1024 of the target's {hidden} hidden units, "
        f"at most the {cpu_count} cores",
    )


def apply_cpu_threads(settings: EngineSettings, hidden_size: Callable[[], int]) -> CpuThreads:
    """Set torch's intra-op threads (process-wide) as ``resolve_cpu_threads`` decides."""
    decision = resolve_cpu_threads(
        settings, hidden_size, os.cpu_count() or 1, os.environ.get("OMP_NUM_THREADS")
    )
    if decision.count is not None:
        import torch

        torch.set_num_threads(decision.count)
    return decision
