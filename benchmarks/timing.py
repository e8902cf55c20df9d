"""Benchmarks' one timing helper: how long a call takes on its device, and which kernels it
launches. Times are printed by the benchmarks, never asserted.

On CUDA ``median_us`` is the median of per-call CUDA events after a warm-up, the L2 cache
flushed before each call (the method of ``triton.testing.do_bench``, written out here so that
``sync_debug`` can cover exactly the timed calls); ``replay_us`` captures the calls in one CUDA
graph first and times its replays, so that a kernel of a few µs is timed without the Python
launch that an eager call would add. Off CUDA (smoke runs under the Triton interpreter, the CPU
rows of ``domain_ops``) a time is the median of ``time.perf_counter`` over the calls that fit
in ``rep_ms``, the first call being the warm-up when more than one fits.

``host_us`` is the other side of an eager call: the host's time in it, issued to an idle
device. ``copy_bandwidth_gbs`` and ``l2_flush_us`` time the yardsticks a table states next to
its times: a device copy's bandwidth, and the flush ``median_us`` runs before each call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

L2_FLUSH_BYTES = 256 << 20  # zeroed before each timed call: more than any GPU's L2
ESTIMATE_CALLS = 5  # calls that size the warm-up and the timed loop
WARMUP_MS = 25.0


def median_us(
    fn: Callable[[], object],
    device: torch.device,
    *,
    rep_ms: float = 100.0,
    flush_l2: bool = True,
    sync_debug: bool = False,
) -> float:
    """Median µs of one call of ``fn``, over the calls that fit in about ``rep_ms``.

    ``flush_l2=False`` leaves what the previous call read in L2 (a step's small tensors stay
    there between its kernels). ``sync_debug`` runs the timed calls under
    ``torch.cuda.set_sync_debug_mode("error")``: a host synchronisation inside ``fn`` raises, so
    a finished measurement shows the call is free of them (CUDA only).
    """
    if device.type != "cuda":
        return _host_median_us(fn, rep_ms)
    fn()  # compiles, allocates, warms the libraries' handles
    torch.cuda.synchronize(device)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def before() -> None:
        if flush_l2:
            flush.zero_()

    start, end = _event(), _event()
    start.record()
    for _ in range(ESTIMATE_CALLS):
        before()
        fn()
    end.record()
    torch.cuda.synchronize(device)
    estimate_ms = max(start.elapsed_time(end) / ESTIMATE_CALLS, 1e-3)
    for _ in range(max(1, int(WARMUP_MS / estimate_ms))):
        fn()
    events = [(_event(), _event()) for _ in range(max(1, int(rep_ms / estimate_ms)))]
    with _sync_checked(sync_debug):
        for start, end in events:
            before()
            start.record()
            fn()
            end.record()
    torch.cuda.synchronize(device)
    return statistics.median(float(s.elapsed_time(e)) for s, e in events) * 1e3


def replay_us(
    calls: Sequence[Callable[[], object]], device: torch.device, *, rep_ms: float = 30.0
) -> float:
    """Median µs per call of ``calls`` run back to back, captured in one CUDA graph and
    replayed (L2 flushed before each replay): device time without launches."""
    if device.type != "cuda":

        def run_all() -> None:
            for call in calls:
                call()

        return _host_median_us(run_all, rep_ms) / len(calls)
    for call in calls:  # compiles, sizes scratch buffers, warms cuBLAS's handles
        call()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return median_us(graph.replay, device, rep_ms=rep_ms) / len(calls)


def launched_kernels(
    fn: Callable[[], object], device: torch.device
) -> list[tuple[str, float]] | None:
    """(name, µs) of each kernel, copy and memset one call of ``fn`` launches, in launch order,
    from the CUDA profiler after a warm-up call (None off CUDA)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return [
        (event.name, float(event.time_range.elapsed_us()))
        for event in prof.events()
        if event.device_type.name == "CUDA"
    ]


def kernel_names(fn: Callable[[], object], device: torch.device) -> list[str] | None:
    """Names of the kernels one call of ``fn`` launches, in order (None off CUDA)."""
    launched = launched_kernels(fn, device)
    return None if launched is None else [name for name, _ in launched]


def host_us(fn: Callable[[], object], device: torch.device, *, calls: int = 20) -> float:
    """Median µs the host spends in one call of ``fn`` issued to an idle device (the device
    synchronised before each call): the Python and launches an eager caller pays per call,
    whatever its kernels take after it returns."""
    fn()  # compiles, allocates, fills the callee's caches
    samples: list[float] = []
    for _ in range(calls):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    _synchronize(device)
    return statistics.median(samples) * 1e6


def copy_bandwidth_gbs(device: torch.device, num_bytes: int) -> float:
    """GB/s of a ``num_bytes`` copy on ``device``, bytes read + written: the ceiling that a
    kernel moving memory is measured against."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), device, rep_ms=200)
    return 2 * num_bytes / us / 1e3


def l2_flush_us(device: torch.device) -> float | None:
    """µs of the L2 flush that ``median_us`` runs before each timed call (None off CUDA, where
    none runs): an eager call whose host work outlasts it keeps the device waiting for its
    launch, and the wait is timed with the call."""
    if device.type != "cuda":
        return None
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return median_us(flush.zero_, device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_median_us(fn: Callable[[], object], rep_ms: float) -> float:
    times: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:] or times) * 1e6


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


@contextmanager
def _sync_checked(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)
