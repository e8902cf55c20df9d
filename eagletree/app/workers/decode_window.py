"""``DecodeWindow``: what the phases of a speculative step read of its ``DecodeInputs`` — rows,
committed lengths, and the slot arithmetic of the window past the committed length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eagletree.app.workers.decode_inputs import DecodeInputs


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """The running requests of one decode step, as the scheduler left them.

    ``seq_lens`` are committed lengths L_b; the request owns ``req_to_token[row, L_b:]`` up to
    its allocated length (at least the worker's ``reserve_per_step`` past L_b).
    """

    req_pool_indices: torch.Tensor  # (bs,) int64 device
    seq_lens: torch.Tensor  # (bs,) int64 device
    seq_lens_cpu: torch.Tensor | None = None  # (bs,) int64 host copy; None on a GPU-only step
    seq_lens_sum: int | None = None

    @staticmethod
    def of(inputs: DecodeInputs) -> DecodeWindow:
        """The window of a step's inputs, over all their rows (padding included)."""
        return DecodeWindow(inputs.rows, inputs.seq_lens, inputs.seq_lens_cpu, inputs.seq_lens_sum)

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    def slots(self, req_to_token: torch.Tensor, width: int) -> torch.Tensor:
        """``req_to_token[row_b, L_b : L_b + width]`` of every request → (bs, width) int64."""
        if width == 1:  # one gather, without the columns' arange and add
            return req_to_token[self.req_pool_indices, self.seq_lens].to(torch.int64).unsqueeze(1)
        columns = self.seq_lens.unsqueeze(1) + torch.arange(width, device=self.seq_lens.device)
        return req_to_token[self.req_pool_indices.unsqueeze(1), columns].to(torch.int64)
