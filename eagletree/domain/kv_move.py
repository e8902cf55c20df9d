"""Reference semantics of moving KV rows between slots: the specification every mover matches."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def move_rows_reference(
    buffers: Sequence[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor
) -> None:
    """For each buffer, ``buf[tgt[i]] = buf[src[i]]``, every source read before any write.

    Targets are distinct except (0, 0) padding pairs (slot 0 is the dummy row), so the result
    does not depend on the order of the pairs; a target may be another pair's source.
    """
    # buffers: each (num_slots, *row_shape); tgt, src: (num_moves,) integer slot ids
    if tgt.shape != src.shape or tgt.dim() != 1:
        raise ValueError(
            f"tgt and src must be 1-D of one shape, got {tuple(tgt.shape)} and {tuple(src.shape)}"
        )
    if tgt.numel() == 0:
        return
    tgt_index, src_index = tgt.long(), src.long()
    for buf in buffers:
        buf[tgt_index] = buf[src_index]  # advanced indexing gathers into a new tensor first
