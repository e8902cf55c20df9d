"""Decode steps replayed from CUDA graphs: batch-size buckets, padding, capture and replay.

A worker's decode step is a function of ``DecodeInputs`` (fixed device buffers) that returns
device tensors and touches nothing but persistent device state (KV pools, draft state). Such a
function can be captured once per batch-size bucket and replayed: a batch of ``bs`` requests
runs in the smallest bucket ``>= bs``, its rows past ``bs`` padded (``decode_inputs``), and
the first ``bs`` rows of the outputs are the answer. Batches above the largest bucket, and idle
batches, run eagerly. A bucket has a graph per sampling mode (greedy; sampled; sampled with
top-k / top-p, whose sort over the vocabulary the others skip); ``capture`` records all three,
so that no request waits for a capture once the engine runs. Runners of one worker (one per
draft shape) share one ``GraphPool``: their graphs replay one at a time, so their intermediates
can share memory.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from eagletree.app.workers.sampler import SamplingMode, sampling_mode

if TYPE_CHECKING:
    from eagletree.app.workers.decode_inputs import DecodeInputBuffers, DecodeInputs
    from eagletree.domain.request import Request

_log = logging.getLogger(__name__)

DecodeFunction = Callable[["DecodeInputs"], tuple[torch.Tensor, ...]]
Progress = Callable[[str], None]


def graph_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32, up to and
    including ``max_batch_size`` (padding wastes at most a third of a step's rows)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    while sizes[-1] < max_batch_size:
        sizes.append(sizes[-1] + 32)
    return (*(s for s in sizes if s < max_batch_size), max_batch_size)


def bucket_for(batch_size: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``batch_size`` rows, or None (idle, or above them all)."""
    if batch_size == 0:
        return None
    return next((b for b in sorted(buckets) if b >= batch_size), None)


class GraphPool:
    """The CUDA-graph memory pool that the graphs of several runners share (made on first use)."""

    def __init__(self) -> None:
        self._handle: Any = None

    def handle(self) -> Any:
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle


class _Captured:
    """One captured graph and the output tensors its replays write."""

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: tuple[torch.Tensor, ...]) -> None:
        self.graph = graph
        self.outputs = outputs


class DecodeStepRunner:
    """Runs ``step`` over ``buffers``: eagerly, or by replaying the graph of a bucket.

    ``buckets`` empty: every step runs eagerly on exactly its rows. With buckets and
    ``use_graphs`` False, steps still run padded to their bucket, eagerly — the same
    arithmetic as a replay, which is how the CPU tests check padding. ``num_coins``: coins a
    step reserves per sampling request. ``capture`` records the graph of every bucket and
    sampling mode; ``pool``: the graph memory pool shared with other runners.
    """

    def __init__(
        self,
        step: DecodeFunction,
        buffers: DecodeInputBuffers,
        *,
        num_coins: int,
        buckets: Sequence[int] = (),
        use_graphs: bool = False,
        pool: GraphPool | None = None,
    ) -> None:
        if buckets and max(buckets) > buffers.capacity:
            raise ValueError(f"bucket {max(buckets)} exceeds the buffers' {buffers.capacity} rows")
        self._decode = step
        self._buffers = buffers
        self._num_coins = num_coins
        self.buckets = tuple(sorted(set(buckets)))
        self.use_graphs = use_graphs
        self._graphs: dict[tuple[int, SamplingMode], _Captured] = {}
        self._pool = GraphPool() if pool is None else pool
        self.num_replays = 0
        self.last_mode = SamplingMode.GREEDY  # the sampling mode of the latest ``run``

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    @property
    def buffers(self) -> DecodeInputBuffers:
        return self._buffers

    def run(
        self,
        requests: Sequence[Request],
        *,
        exact_lengths: bool = True,
        lengths: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """One step over ``requests`` → the step's outputs, first dimension ``len(requests)``.

        ``exact_lengths`` False: the host's committed lengths lag (a step is in flight), so an
        eager step runs without host lengths; ``lengths``: exact ones the caller computed in
        their place (both as ``DecodeInputBuffers.fill``).
        """
        bs = len(requests)
        bucket = bucket_for(bs, self.buckets)
        mode = self.last_mode = sampling_mode(requests)
        if bucket is not None and self.use_graphs and (bucket, mode) not in self._graphs:
            _log.info("capturing the %s CUDA graph of batch size %d", mode.value, bucket)
            with _no_collection_during_capture():
                self._capture(bucket, mode)
        padded = bs if bucket is None else bucket
        inputs = self._buffers.fill(
            requests,
            padded,
            self._num_coins,
            exact_lengths=exact_lengths,
            lengths=lengths,
            gather=False,  # the step gathers: inside the graph
            mode=mode,
        )
        captured = None if bucket is None else self._graphs.get((bucket, mode))
        if captured is None:
            outputs = self._step(inputs)
        else:
            captured.graph.replay()
            outputs = captured.outputs
            self.num_replays += 1
        return tuple(out[:bs] for out in outputs)

    def capture(self, progress: Progress | None = None, label: str = "") -> float:
        """Capture the graph of every bucket and sampling mode, largest first (so the
        graph memory pool and lazily grown buffers reach their final size first); returns the
        seconds it took. ``label`` names the runner in the progress lines."""
        report = progress or _log.info
        what = f"CUDA graphs{f' of {label}' if label else ''}"
        started = time.perf_counter()
        with _no_collection_during_capture():  # one collection for all of them
            for done, bucket in enumerate(reversed(self.buckets), start=1):
                for mode in SamplingMode:
                    if (bucket, mode) not in self._graphs:
                        self._capture(bucket, mode)
                report(f"capturing {what}: {done}/{len(self.buckets)} (batch size {bucket})")
        elapsed = time.perf_counter() - started
        report(f"captured {len(SamplingMode) * len(self.buckets)} {what} in {elapsed:.1f} s")
        return elapsed

    def time_step(
        self, bucket: int, mode: SamplingMode, repeats: int, *, warm_up: bool = True
    ) -> float:
        """Seconds one step of ``bucket`` padding rows in ``mode`` takes (its graph's replay
        where one is captured, else the eager step), the median of ``repeats`` runs after one
        warm-up (none where not ``warm_up``: an eager step already run at another size).
        Padding rows read and write only the padding row and slot 0, so live requests are
        untouched. Start-up work: it waits for the device."""
        self._buffers.fill([], bucket, self._num_coins)
        inputs = self._buffers.views(bucket, 0, mode=mode)
        captured = self._graphs.get((bucket, mode))

        def run() -> None:
            if captured is None:
                self._step(inputs)
            else:
                captured.graph.replay()

        cuda = self._buffers.device.type == "cuda"
        times = []
        for index in range(0 if warm_up else 1, repeats + 1):  # run 0: the warm-up
            if cuda:
                torch.cuda.synchronize()  # SYNC: start-up timing of the cost table
            started = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()  # SYNC: start-up timing of the cost table
            if index:
                times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2]

    def _step(self, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """The decode step over ``inputs``, after the device's lengths and tokens of its rows
        (``gather_device_state``)."""
        self._buffers.gather_device_state(inputs)
        return self._decode(inputs)

    def _capture(self, bucket: int, mode: SamplingMode) -> None:
        """Capture one graph; the caller holds ``_no_collection_during_capture``."""
        # every row is padding: the warm-up runs touch only the padding row and slot 0
        self._buffers.fill([], bucket, self._num_coins)
        inputs = self._buffers.views(bucket, 0, mode=mode)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles kernels, sizes lazy buffers and workspaces
            self._step(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool.handle()):
            outputs = self._step(inputs)
        self._graphs[(bucket, mode)] = _Captured(graph, outputs)


@contextlib.contextmanager
def _no_collection_during_capture() -> Iterator[None]:
    """Collect garbage now and not until the captures end: the collector may free an earlier
    engine's CUDA graphs, and destroying a graph while a stream captures invalidates the
    capture (``cudaErrorStreamCaptureInvalidated``, seen when engines come and go lazily
    capturing sampling graphs). One collection per batch of captures: a full collection with
    torch loaded takes a good part of a small model's capture."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
