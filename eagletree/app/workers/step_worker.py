"""StepWorker: what every worker is built on — prefill batches, decode inputs, the step runner.

A worker's decode step is one device function of the step's ``DecodeInputs``
(``_decode_on_device``), which a ``DecodeStepRunner`` runs eagerly or replays from the CUDA graph
of a batch-size bucket; the request data of every step goes through the runner's
``DecodeInputBuffers`` (one pinned host block, one copy). The base holds those, the builder of
prefill batches and the step's fused kernels, and captures the graphs; each worker adds its
``step`` and its window reserve.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from eagletree.app.workers.decode_inputs import DecodeInputBuffers
from eagletree.app.workers.forward_batches import BatchBuilder
from eagletree.app.workers.step_graphs import DecodeFunction, DecodeStepRunner, GraphPool

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch

    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.app.engine.worker import StepOutput
    from eagletree.app.workers.decode_inputs import DecodeInputs
    from eagletree.app.workers.step_kernels import StepKernels
    from eagletree.domain.request import Request
    from eagletree.ports.memory import ReqToTokenPool

# slots a window grows past the step's reserve when it grows (``Worker.grow_ahead``): a plain
# step's window then grows one step in 64, a chain S5's about one in 12, a wide tree's one in
# 8; 48 requests hold at most 3,072 slots ahead, 5 % of the default pool, given back when a
# request waits for them
GROW_AHEAD = 64


class StepWorker(ABC):
    """The base of the ``Worker`` implementations.

    ``kernels``: the fused device functions of a step (``StepKernels``). ``graph_buckets``:
    batch sizes whose decode step runs padded to a fixed shape (and, with ``use_cuda_graphs``,
    from a captured CUDA graph; ``capture_graphs`` records them); this takes one req_to_token
    row for padding. ``num_coins``: coins a decode step reserves per sampling request.
    ``device_lengths`` / ``device_tokens``: the buffers keep every row's committed length /
    pending token on the device (``DecodeInputBuffers``). ``decode``: the device function
    ``step_runner`` runs (default: ``_decode_on_device``).
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        *,
        kernels: StepKernels,
        num_coins: int,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
        device_lengths: bool = False,
        device_tokens: bool = False,
        decode: DecodeFunction | None = None,
    ) -> None:
        self._batches = BatchBuilder(req_to_token_pool)
        self._kernels = kernels
        self._buckets = tuple(graph_buckets)
        self._use_graphs = use_cuda_graphs
        self._graph_pool = GraphPool()
        self._buffers = DecodeInputBuffers.for_pool(
            req_to_token_pool,
            padded=bool(graph_buckets),
            device_lengths=device_lengths,
            device_tokens=device_tokens,
        )
        self._steps = self._new_step_runner(decode or self._decode_on_device, num_coins)

    @property
    def step_runner(self) -> DecodeStepRunner:
        return self._steps

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        """Capture the decode step's CUDA graphs of every bucket; returns the seconds taken."""
        return self._steps.capture(progress)

    def calibrate(self, progress: Callable[[str], None] | None = None) -> None:
        """Measure what the worker's per-step choices need (nothing here)."""
        return None

    def untimed_steps(self) -> AbstractContextManager[None]:
        """Steps that teach the worker's choices nothing of what a step costs (nothing here:
        it times none)."""
        return contextlib.nullcontext()

    def _new_step_runner(self, step: DecodeFunction, num_coins: int) -> DecodeStepRunner:
        """A step runner of ``step`` over this worker's buffers, buckets and graph pool."""
        return DecodeStepRunner(
            step,
            self._buffers,
            num_coins=num_coins,
            buckets=self._buckets,
            use_graphs=self._use_graphs,
            pool=self._graph_pool,
        )

    @property
    @abstractmethod
    def reserve_per_step(self) -> int: ...

    @property
    def grow_ahead(self) -> int:
        return GROW_AHEAD

    @abstractmethod
    def can_run_ahead(self, decode: Sequence[Request]) -> bool: ...

    @abstractmethod
    def step(self, plan: SchedulePlan) -> StepOutput: ...

    def _decode_on_device(self, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """The decode step over ``inputs`` as one device function (what a graph replays):
        device work only, reading the inputs and persistent device state."""
        raise NotImplementedError(f"{type(self).__name__} has no decode step a graph replays")
