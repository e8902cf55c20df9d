"""App: a step's data between host and device — request data going to the device without
waiting for it (``to_device``), and a step's outputs on their way to the host: pinned copies and
an event, read once.

The engine's overlap mode launches step i + 1 before it reads step i's tokens. Step i's outputs
may be a CUDA graph's static output tensors, which the replay of step i + 1 overwrites, so they
are copied at launch, in stream order, into a pinned host block with a non-blocking copy, and an
event recorded after the copy says when the block is ready. Two blocks alternate: at most one
step is in flight, so the block being read is never the one the next copy writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eagletree.app.engine.worker import StepOutput


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A launched step: its output and, once ``rows`` is called, its values on the host."""

    output: StepOutput
    block: (
        torch.Tensor
    )  # (bs, max_emitted + 2 + W) int64 host: tokens, emitted, committed, observed
    event: torch.cuda.Event | None  # recorded after the copy (None on the CPU: already done)

    def rows(self) -> list[list[int]]:
        """Per request: its tokens, then num_emitted, num_committed, then the observed columns
        (waits for the copy)."""
        if self.event is not None:
            self.event.synchronize()  # SYNC: the host needs the step's tokens for its stops
        rows: list[list[int]] = self.block.tolist()
        return rows


class StepReadback:
    """Starts the device → host copy of each launched step's outputs (``start``)."""

    def __init__(self) -> None:
        self._blocks: list[torch.Tensor] = []
        self._turn = 0

    def start(self, output: StepOutput) -> PendingStep:
        parts = [output.tokens, output.num_emitted.unsqueeze(1), output.num_committed.unsqueeze(1)]
        if output.observed is not None:
            parts.append(output.observed)
        columns = torch.cat(parts, dim=1).to(torch.int64)  # (bs, max_emitted + 2 + W)
        if columns.device.type != "cuda":
            return PendingStep(output, columns, None)
        block = self._block(columns.shape).copy_(columns, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return PendingStep(output, block, event)

    def _block(self, shape: torch.Size) -> torch.Tensor:
        """The next pinned block, grown to hold ``shape`` (a view of its first elements)."""
        numel = shape.numel()
        if len(self._blocks) < 2:
            self._blocks.append(torch.empty(0, dtype=torch.int64))
        block = self._blocks[self._turn]
        if block.numel() < numel:
            block = torch.empty(max(numel, 2 * block.numel()), dtype=torch.int64, pin_memory=True)
            self._blocks[self._turn] = block
        self._turn ^= 1
        return block[:numel].view(shape)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host → device copy that does not wait for the device (pinned staging on CUDA)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
