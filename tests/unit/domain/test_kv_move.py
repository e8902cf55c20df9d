"""Tests of the KV row-move reference: gather every source, then scatter, on every buffer."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.kv_move import move_rows_reference
from tests.hypothesis_profiles import examples

from .brute_force.compaction import FakeKVPool
from .strategies import DEVICES


def slot_buffers(num_slots: int, device: str) -> list[torch.Tensor]:
    """Buffers of several row shapes and dtypes, every row holding its slot id."""
    ids = torch.arange(num_slots, device=device)
    return [
        ids.clone(),
        ids.to(torch.int32).view(-1, 1).repeat(1, 3),
        ids.float().view(-1, 1, 1).repeat(1, 2, 2),
        ids.to(torch.bfloat16).view(-1, 1).repeat(1, 5),  # exact: ids stay below 256
    ]


def payloads(buf: torch.Tensor) -> list[int]:
    rows = buf.reshape(buf.shape[0], -1).float()
    assert torch.equal(rows.amin(dim=1), rows.amax(dim=1)), "a row was torn"
    return [int(v) for v in rows[:, 0].tolist()]


def random_moves(num_slots: int, rng: random.Random) -> list[tuple[int, int]]:
    """Distinct targets (never slot 0), arbitrary sources (targets included), and (0, 0) pads."""
    targets = rng.sample(range(1, num_slots), rng.randint(0, num_slots - 1))
    pairs = [(t, rng.randrange(num_slots)) for t in targets]
    pairs += [(0, 0)] * rng.randint(0, 3)
    rng.shuffle(pairs)
    return pairs


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(150), deadline=None)
@given(
    num_slots=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    index_dtype=st.sampled_from([torch.int64, torch.int32]),
)
def test_moves_equal_the_gather_then_scatter_model_on_every_buffer(
    device: str, num_slots: int, seed: int, index_dtype: torch.dtype
) -> None:
    rng = random.Random(seed)
    pairs = random_moves(num_slots, rng)
    tgt = torch.tensor([t for t, _ in pairs], dtype=index_dtype, device=device)
    src = torch.tensor([s for _, s in pairs], dtype=index_dtype, device=device)
    buffers = slot_buffers(num_slots, device)
    move_rows_reference(buffers, tgt, src)
    model = FakeKVPool(num_slots)
    model.move(pairs)
    for buf in buffers:
        assert payloads(buf) == model.payload
    # the pair order does not matter
    rng.shuffle(pairs)
    again = slot_buffers(num_slots, device)
    move_rows_reference(
        again,
        torch.tensor([t for t, _ in pairs], dtype=index_dtype, device=device),
        torch.tensor([s for _, s in pairs], dtype=index_dtype, device=device),
    )
    for a, b in zip(again, buffers, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_a_cycle_of_moves_reads_every_source_before_writing(device: str) -> None:
    # 1 ← 2, 2 ← 3, 3 ← 1: any write-before-read order would duplicate a payload
    buffers = slot_buffers(5, device)
    move_rows_reference(
        buffers, torch.tensor([1, 2, 3], device=device), torch.tensor([2, 3, 1], device=device)
    )
    model = FakeKVPool(5)
    model.move([(1, 2), (2, 3), (3, 1)])
    assert model.payload == [0, 2, 3, 1, 4]
    for buf in buffers:
        assert payloads(buf) == model.payload


@pytest.mark.parametrize("device", DEVICES)
def test_no_moves_and_padding_only_leave_the_buffers_unchanged(device: str) -> None:
    for tgt in (torch.empty(0, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)):
        buffers = slot_buffers(6, device)
        move_rows_reference(buffers, tgt.to(device), tgt.to(device))
        for buf in buffers:
            assert payloads(buf) == list(range(6))
    move_rows_reference([], torch.tensor([1]), torch.tensor([2]))  # no buffers: nothing to do


@pytest.mark.parametrize(
    ("tgt", "src"),
    [
        (torch.tensor([1, 2]), torch.tensor([1])),
        (torch.tensor([[1, 2]]), torch.tensor([[2, 1]])),
    ],
)
def test_slot_lists_of_different_shapes_or_not_1d_are_rejected(
    tgt: torch.Tensor, src: torch.Tensor
) -> None:
    buf = torch.arange(4)
    with pytest.raises(ValueError, match="1-D"):
        move_rows_reference([buf], tgt, src)
    assert buf.tolist() == [0, 1, 2, 3]
