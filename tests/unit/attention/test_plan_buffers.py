"""Attention plan buffers: fixed-width offsets are written once per (bs, width) and kept."""

from __future__ import annotations

import torch

from eagletree.adapters.attention.metadata import PlanBuffers


def test_fixed_width_offsets_are_kept_per_shape_and_survive_ragged_fills() -> None:
    buffers = PlanBuffers(4, torch.device("cpu"))
    qo_indptr, query_lens = buffers.fill_fixed(3, 5)
    assert qo_indptr.tolist() == [0, 5, 10, 15] and query_lens.tolist() == [5, 5, 5]
    ragged_indptr, ragged_lens = buffers.fill_ragged(torch.tensor([2, 7, 1]))
    assert ragged_indptr.tolist() == [0, 2, 9, 10] and ragged_lens.tolist() == [2, 7, 1]
    again = buffers.fill_fixed(3, 5)
    assert again[0] is qo_indptr and again[1] is query_lens  # nothing written a second time
    assert qo_indptr.tolist() == [0, 5, 10, 15] and query_lens.tolist() == [5, 5, 5]
    narrower = buffers.fill_fixed(3, 4)
    assert narrower[0].tolist() == [0, 4, 8, 12] and narrower[1].tolist() == [4, 4, 4]
    wider = buffers.fill_fixed(9, 1)  # more requests than the shared buffers hold
    assert wider[0].tolist() == list(range(10)) and wider[1].tolist() == [1] * 9
    assert qo_indptr.tolist() == [0, 5, 10, 15]
