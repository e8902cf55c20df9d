"""Tests of compaction: the move plan on a fake KV pool, compact-to-front and the bonus tokens."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.compaction import (
    accepted_move_plan,
    bonus_tokens,
    compact_rows,
    compact_to_front,
    compaction_plan,
)
from eagletree.domain.kv_move import move_rows_reference
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .brute_force.compaction import FakeKVPool, move_pairs_reference
from .strategies import DEVICES, TreeBatch, tree_batches


def accept_tensors(
    paths: list[list[int]], num_nodes: int, num_steps: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """accept_index (bs, S+1) int32 of global node ids, −1 padded, and accept_length (bs,)."""
    rows = [
        [b * num_nodes + node for node in path] + [-1] * (num_steps + 1 - len(path))
        for b, path in enumerate(paths)
    ]
    accept_index = torch.tensor(rows, dtype=torch.int32, device=device).view(
        len(paths), num_steps + 1
    )
    accept_length = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int32, device=device)
    return accept_index, accept_length


def slot_payload_buffers(num_slots: int, device: str) -> list[torch.Tensor]:
    """KV-like buffers whose every row holds its own slot id (different shapes and dtypes)."""
    ids = torch.arange(num_slots, device=device)
    return [
        ids.clone(),
        ids.float().view(-1, 1, 1).repeat(1, 2, 3),
        ids.to(torch.bfloat16).view(-1, 1).repeat(1, 4),  # exact: slot ids stay below 256
    ]


def check_plan(
    paths: list[list[int]],
    num_nodes: int,
    num_steps: int,
    verify_slots: list[int],
    num_slots: int,
    device: str,
) -> None:
    """Everything the spec promises about accepted_move_plan, on one batch."""
    bs = len(paths)
    accept_index, accept_length = accept_tensors(paths, num_nodes, num_steps, device)
    slots = torch.tensor(verify_slots, dtype=torch.int64, device=device)
    tgt, src = accepted_move_plan(accept_index, accept_length, slots, num_draft_tokens=num_nodes)
    moves = move_pairs_reference(
        accept_index.tolist(), accept_length.tolist(), verify_slots, num_nodes
    )
    # layout (the implementation's documented convention): pair b·(S+1) + t moves node t;
    # pairs past the path and pairs already in place are (0, 0) padding
    assert tgt.shape == src.shape == (bs * (num_steps + 1),)
    expected = [(0, 0)] * (bs * (num_steps + 1))
    cursor = 0
    for b, path in enumerate(paths):
        for t in range(len(path)):
            move = moves[cursor]
            cursor += 1
            expected[b * (num_steps + 1) + t] = move if move[0] != move[1] else (0, 0)
    pairs = list(zip(tgt.tolist(), src.tolist(), strict=True))
    assert pairs == expected
    real = [p for p in pairs if p != (0, 0)]
    assert len({t for t, _ in real}) == len(real), "targets must be distinct"
    # on a fake pool whose payload is the slot id: the window front holds the path, in order
    buffers = slot_payload_buffers(num_slots, device)
    move_rows_reference(buffers, tgt, src)
    model = FakeKVPool(num_slots)
    model.move(moves)
    for buf in buffers:
        assert buf.reshape(num_slots, -1).float().mean(dim=1).long().tolist() == model.payload
    for b, path in enumerate(paths):
        window = verify_slots[b * num_nodes : (b + 1) * num_nodes]
        held = [model.payload[window[t]] for t in range(len(path))]
        assert held == [window[node] for node in path]
    touched = {t for t, _ in moves}
    assert all(model.payload[s] == s for s in range(num_slots) if s not in touched)
    # a mover that copies pair by pair, in pair order, is also right (targets never lie after
    # their sources inside a window), which is what lets kernels move in chunks
    sequential = list(range(num_slots))
    for t, s in pairs:
        sequential[t] = sequential[s]
    assert sequential == model.payload


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(200), deadline=None)
@given(trees=tree_batches(), seed=st.integers(0, 2**31 - 1), contiguous=st.booleans())
def test_the_move_plan_puts_each_accepted_path_at_the_front_of_its_window(
    device: str, trees: TreeBatch, seed: int, contiguous: bool
) -> None:
    bs, n = len(trees.parents), trees.num_draft_tokens
    num_slots = 1 + bs * n + 7
    rng = random.Random(seed)
    if contiguous:  # windows as the allocator hands them out, then an arbitrary permutation
        start = rng.randint(1, 7)
        verify_slots = list(range(start, start + bs * n))
    else:
        verify_slots = rng.sample(range(1, num_slots), bs * n)
    check_plan(trees.paths, n, trees.num_steps, verify_slots, num_slots, device)


ADVERSARIAL = {
    # research §4.3's worked example: w1 ← w2, w2 ← w5; w2 is a target and a source
    "worked example": (8, 3, [[0, 2, 5]]),
    # every target but the first is the source of the pair before it
    "shift by one": (8, 4, [[0, 2, 3, 4, 5]]),
    "shift by one, N < S + 1": (4, 5, [[0, 2, 3]]),
    "already in place": (6, 5, [[0, 1, 2, 3, 4, 5]]),
    "root only": (6, 2, [[0]]),
    "several requests": (6, 4, [[0, 2, 3, 4, 5], [0, 1, 3, 5], [0], [0, 3, 4, 5]]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ADVERSARIAL))
@pytest.mark.parametrize("window", ["ascending", "descending", "interleaved"])
def test_adversarial_paths_where_targets_are_also_sources(
    device: str, name: str, window: str
) -> None:
    n, steps, paths = ADVERSARIAL[name]
    bs = len(paths)
    if window == "ascending":
        verify_slots = list(range(1, bs * n + 1))
    elif window == "descending":
        verify_slots = list(range(bs * n, 0, -1))
    else:  # requests' windows interleave slot by slot
        verify_slots = [1 + t * bs + b for b in range(bs) for t in range(n)]
    check_plan(paths, n, steps, verify_slots, bs * n + 1, device)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(150), deadline=None)
@given(trees=tree_batches(), seed=st.integers(0, 2**31 - 1))
def test_compact_to_front_and_bonus_tokens_read_the_accepted_nodes(
    device: str, trees: TreeBatch, seed: int
) -> None:
    bs, n, steps = len(trees.parents), trees.num_draft_tokens, trees.num_steps
    gen = torch.Generator().manual_seed(seed)
    accept_index, accept_length = accept_tensors(trees.paths, n, steps, device)
    hidden = torch.randn((bs * n, 3), generator=gen).to(device)
    predict = torch.randint(0, 1000, (bs * n,), generator=gen, dtype=torch.int32).to(device)
    before = hidden.clone()
    for x in (hidden, predict):
        out = compact_to_front(x, accept_index, num_draft_tokens=n)
        assert out.shape == x.shape and out.dtype == x.dtype
        for b, path in enumerate(trees.paths):
            for t, node in enumerate(path):
                assert torch.equal(out[b * n + t], x[b * n + node])
    assert torch.equal(hidden, before), "compact_to_front must not modify its input"
    bonus = bonus_tokens(predict, accept_index, accept_length)
    assert bonus.shape == (bs,)
    assert bonus.tolist() == [
        predict[b * n + path[-1]].item() for b, path in enumerate(trees.paths)
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_compact_to_front_reads_the_original_rows_when_paths_overlap_their_destinations(
    device: str,
) -> None:
    n, steps = 6, 4
    paths = [[0, 2, 3, 4, 5], [0, 1, 4]]
    accept_index, accept_length = accept_tensors(paths, n, steps, device)
    x = torch.arange(2 * n, device=device) * 10
    out = compact_to_front(x, accept_index, num_draft_tokens=n)
    for b, path in enumerate(paths):
        assert out[b * n : b * n + len(path)].tolist() == [10 * (b * n + node) for node in path]
    assert bonus_tokens(x, accept_index, accept_length).tolist() == [50, 100]


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_plans_no_moves_and_compacts_nothing(device: str) -> None:
    n, steps = 8, 3
    accept_index = torch.empty((0, steps + 1), dtype=torch.int32, device=device)
    accept_length = torch.empty((0,), dtype=torch.int32, device=device)
    tgt, src = accepted_move_plan(
        accept_index, accept_length, torch.empty(0, dtype=torch.int64, device=device), n
    )
    assert tgt.shape == src.shape == (0,)
    hidden = torch.empty((0, 5), device=device)
    assert compact_to_front(hidden, accept_index, n).shape == (0, 5)
    predict = torch.empty(0, dtype=torch.int32, device=device)
    assert bonus_tokens(predict, accept_index, accept_length).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(60), deadline=None)
@given(trees=tree_batches(), seed=st.integers(0, 2**31 - 1))
def test_inplace_compaction_writes_the_same_path_rows_into_its_input(
    device: str, trees: TreeBatch, seed: int
) -> None:
    bs, n, steps = len(trees.parents), trees.num_draft_tokens, trees.num_steps
    gen = torch.Generator().manual_seed(seed)
    accept_index, _ = accept_tensors(trees.paths, n, steps, device)
    hidden = torch.randn((bs * n, 3), generator=gen).to(device)
    expected = compact_to_front(hidden, accept_index, num_draft_tokens=n)
    out = compact_to_front(hidden, accept_index, num_draft_tokens=n, inplace=True)
    assert out.data_ptr() == hidden.data_ptr()
    for b, path in enumerate(trees.paths):
        rows = slice(b * n, b * n + len(path))
        assert torch.equal(out[rows], expected[rows])


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(100), deadline=None)
@given(trees=tree_batches(), seed=st.integers(0, 2**31 - 1))
def test_the_compaction_plan_equals_the_move_plan_and_the_row_compaction(
    impl: str, device: str, trees: TreeBatch, seed: int
) -> None:
    plan_fn = compaction_plan
    if impl == "triton":
        requires_triton(device)
        from eagletree.adapters.kernels.triton.compaction import compaction_plan as plan_fn
    bs, n, steps = len(trees.parents), trees.num_draft_tokens, trees.num_steps
    gen = torch.Generator().manual_seed(seed)
    accept_index, accept_length = accept_tensors(trees.paths, n, steps, device)
    verify_slots = (torch.randperm(4 * bs * n + 8, generator=gen)[: bs * n] + 1).to(device)
    plan = plan_fn(accept_index, accept_length, verify_slots, n)
    tgt, src = accepted_move_plan(accept_index, accept_length, verify_slots, n)
    assert torch.equal(plan.tgt, tgt) and torch.equal(plan.src, src)
    hidden = torch.randn((bs * n, 3), generator=gen).to(device)
    expected = compact_to_front(hidden, accept_index, n)
    compacted = compact_rows(hidden.clone(), plan)
    for b, path in enumerate(trees.paths):  # the path rows; the rest is never read
        front = slice(b * n, b * n + len(path))
        assert torch.equal(compacted[front], expected[front])
