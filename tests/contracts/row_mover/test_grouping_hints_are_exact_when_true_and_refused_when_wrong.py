"""The ``independent_groups`` hint: exact when true, refused (naming the pair, slot and
groups) when wrong, and kept by the compaction plans' groups of S + 1 pairs. Triton
runs under ``TRITON_INTERPRET=1`` on CPU (small shapes) and natively on CUDA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.contracts.kv_pool.moves import move_sets
from tests.contracts.kv_pool.pools import raw
from tests.contracts.row_mover.movers import (
    FAST,
    HINTED_MOVERS,
    NUM_SLOTS,
    assert_moves_like_the_reference,
    compaction_pairs,
    needs_triton,
    random_buffers,
    slots,
)


@st.composite
def grouped_moves(draw: st.DrawFn, group_size: int) -> tuple[list[int], list[int]]:
    """Groups of ``group_size`` consecutive pairs (the last may be short), each with private
    slots: chains, cycles, self-moves and (0, 0) padding inside a group, in any order, plus
    reads of slots nobody writes (shared across groups: reads alone are no hazard)."""
    num_groups = draw(st.integers(1, 5))
    order = draw(st.permutations(range(1, NUM_SLOTS)))
    read_only, private = order[:6], order[6:]
    tgt: list[int] = []
    src: list[int] = []
    for g in range(num_groups):
        own = private[g * (group_size + 3) : (g + 1) * (group_size + 3)]
        size = draw(st.integers(1, group_size)) if g == num_groups - 1 else group_size
        targets = own[:size]
        pairs = []
        for t in targets:
            kind = draw(st.sampled_from(["group", "group", "read_only", "self", "padding"]))
            if kind == "group":
                pairs.append((t, draw(st.sampled_from(own))))
            elif kind == "read_only":
                pairs.append((t, draw(st.sampled_from(read_only))))
            elif kind == "self":
                pairs.append((t, t))
            else:
                pairs.append((0, 0))
        pairs = draw(st.permutations(pairs))
        tgt += [t for t, _ in pairs]
        src += [s for _, s in pairs]
    return tgt, src


def crossing_hazard(tgt: list[int], src: list[int], group_size: int) -> bool:
    """Python model: some pair reads a slot that a moving pair of another group writes."""
    writer = {t: j for j, (t, s) in enumerate(zip(tgt, src, strict=True)) if t != s}
    return any(
        t != s and s in writer and writer[s] // group_size != i // group_size
        for i, (t, s) in enumerate(zip(tgt, src, strict=True))
    )


@pytest.mark.parametrize("mover_name", list(HINTED_MOVERS))
@FAST
@given(data=st.data(), group_size=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_a_true_grouping_hint_moves_exactly_like_the_reference(
    mover_name: str, device: torch.device, data: st.DataObject, group_size: int, seed: int
) -> None:
    needs_triton(mover_name, device)
    tgt, src = data.draw(grouped_moves(group_size))
    assert not crossing_hazard(tgt, src, group_size)
    mover = HINTED_MOVERS[mover_name]()
    assert_moves_like_the_reference(
        lambda bufs: mover.move(
            bufs, slots(tgt, device), slots(src, device), independent_groups=group_size
        ),
        slots(tgt, device),
        slots(src, device),
        device,
        seed,
    )


@pytest.mark.parametrize("mover_name", list(HINTED_MOVERS))
@FAST
@given(moves=move_sets(num_rows=NUM_SLOTS), group_size=st.integers(1, 5))
def test_any_grouping_hint_is_refused_when_wrong_and_exact_when_right(
    mover_name: str, device: torch.device, moves: tuple[list[int], list[int]], group_size: int
) -> None:
    needs_triton(mover_name, device)
    tgt, src = moves
    mover = HINTED_MOVERS[mover_name]()
    buffers = random_buffers(NUM_SLOTS, device, 1)
    before = [raw(buf).clone() for buf in buffers]
    if crossing_hazard(tgt, src, group_size):
        with pytest.raises(ValueError, match=rf"independent_groups={group_size} is wrong"):
            mover.move(
                buffers, slots(tgt, device), slots(src, device), independent_groups=group_size
            )
        assert all(torch.equal(raw(b), old) for b, old in zip(buffers, before, strict=True))
    else:
        assert_moves_like_the_reference(
            lambda bufs: mover.move(
                bufs, slots(tgt, device), slots(src, device), independent_groups=group_size
            ),
            slots(tgt, device),
            slots(src, device),
            device,
        )


@pytest.mark.parametrize("mover_name", ["torch", "triton"])
def test_a_hint_off_by_one_pair_names_the_pair_slot_and_groups(
    mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    # groups of 3: [5←6, 6←7, 0←0] [9←10, 10←5, 0←0]: pair 4 reads slot 5, written by pair 0
    tgt, src = [5, 6, 0, 9, 10, 0], [6, 7, 0, 10, 5, 0]
    mover = HINTED_MOVERS[mover_name]()
    message = r"pair 4 \(group 1\) reads slot 5, which a pair of group 0 writes"
    with pytest.raises(ValueError, match=message):
        mover.move(random_buffers(16, device, 0), slots(tgt, device), slots(src, device),
                   independent_groups=3)  # fmt: skip
    with pytest.raises(ValueError, match="must be >= 1"):
        mover.move(random_buffers(16, device, 0), slots(tgt, device), slots(src, device),
                   independent_groups=0)  # fmt: skip


@pytest.mark.parametrize("mover_name", list(HINTED_MOVERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reverse", [False, True])  # groups stay whole requests either way
def test_compaction_plans_keep_the_grouping_promise_with_s_plus_one(
    mover_name: str, seed: int, reverse: bool, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    gen = torch.Generator().manual_seed(seed)
    bs, num_nodes, num_steps = 7, 8, 4
    tgt, src = compaction_pairs(gen, bs, num_nodes, num_steps, device)
    if reverse:
        tgt, src = tgt.flip(0), src.flip(0)
    mover = HINTED_MOVERS[mover_name]()
    assert_moves_like_the_reference(
        lambda bufs: mover.move(bufs, tgt, src, independent_groups=num_steps + 1),
        tgt,
        src,
        device,
        seed,
    )
