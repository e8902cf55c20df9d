"""Adapter: RowMovers — per-buffer torch gather/scatter and the one-launch Triton move."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eagletree.adapters.memory.raw_words import as_raw_words


class TorchRowMover:
    """Gathers the source rows into a temporary, then scatters them: two kernels per buffer."""

    def move(self, buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
        # buffers: each (num_slots, *row_shape); tgt, src: (num_moves,) integer slot ids
        if tgt.numel() == 0:
            return
        tgt_index, src_index = tgt.long(), src.long()
        for buf in buffers:
            words = as_raw_words(buf)
            words.index_copy_(0, tgt_index, words.index_select(0, src_index))
