"""Builds the EXTEND (prefill) ForwardBatches of scheduled requests.

(A decode step's batch is built on the device from ``DecodeInputs``: see
``app/workers/decode_inputs.py``.)

Host metadata (token ids, lengths, row ids) is assembled in CPU tensors and copied without
waiting for the device; KV slots are gathered on the device from the req_to_token rows the
scheduler filled, so a batch never carries slots the scheduler did not hand out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.domain.batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from eagletree.domain.request import Request
    from eagletree.ports.memory import ReqToTokenPool


class BatchBuilder:
    """ForwardBatches over one req_to_token pool, on that pool's device."""

    def __init__(self, req_to_token_pool: ReqToTokenPool) -> None:
        self._req_to_token_pool = req_to_token_pool

    @property
    def device(self) -> torch.device:
        return self._req_to_token_pool.req_to_token.device

    def extend(self, requests: Sequence[Request]) -> tuple[ForwardBatch, torch.Tensor]:
        """Prefill of each request's uncommitted tokens; returns the batch and the logits rows
        (each request's last token) the runner should compute."""
        prefix_lens = [r.committed_len for r in requests]
        new_ids = [r.fill_ids()[prefix:] for r, prefix in zip(requests, prefix_lens, strict=True)]
        lens = [len(ids) for ids in new_ids]  # host ints: a step reads no tensor back
        assert min(lens, default=1) > 0, "a prefill request has no new token"
        extend_lens = torch.tensor(lens, dtype=torch.int64)
        seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
        total = sum(lens)
        # positions: (total,) prefix_len + 0..extend_len-1, request by request
        first_of_request = torch.cumsum(extend_lens, 0) - extend_lens
        offsets = torch.arange(total) - torch.repeat_interleave(first_of_request, extend_lens)
        positions = torch.repeat_interleave(seq_lens, extend_lens) + offsets
        rows = torch.tensor([r.row for r in requests], dtype=torch.int64)
        token_rows = torch.repeat_interleave(rows, extend_lens)
        input_ids = torch.tensor([t for ids in new_ids for t in ids], dtype=torch.int64)
        logits_rows = torch.cumsum(extend_lens, 0) - 1
        device = self.device
        positions_dev = to_device(positions, device)
        batch = ForwardBatch(
            mode=ForwardMode.EXTEND,
            input_ids=to_device(input_ids, device),
            positions=positions_dev,
            seq_lens=to_device(seq_lens, device),
            req_pool_indices=to_device(rows, device),
            out_cache_loc=self._slots(to_device(token_rows, device), positions_dev),
            extend_lens=to_device(extend_lens, device),
            seq_lens_cpu=seq_lens,
            seq_lens_sum=sum(prefix_lens),
            extend_lens_cpu=extend_lens,
        )
        return batch, to_device(logits_rows, device)

    def _slots(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        # out_cache_loc: (num_tokens,) int64 slots from req_to_token (int32)
        return self._req_to_token_pool.req_to_token[rows, columns].to(torch.int64)
