"""RowMovers on their own: the ``independent_groups`` hint (exact when true, refused when false),
moves too large for one launch, and the row table / launch shape heuristics. Bit-exact against
``domain.kv_move.move_rows_reference``; Triton runs under ``TRITON_INTERPRET=1`` on CPU (small
shapes) and natively on CUDA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.adapters.kernels.triton.kv_move_table import (
    Tuning,
    build_row_table,
    segment_launch,
    tile_shape,
)
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.domain.kv_move import move_rows_reference
from tests.conftest import requires_triton
from tests.contracts.test_kv_pool import accepted_path_moves, move_sets, raw

NUM_SLOTS = 64
FAST = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
Mover = TorchRowMover | TritonRowMover
HINTED_MOVERS: dict[str, Callable[[], Mover]] = {
    "torch": lambda: TorchRowMover(debug_checks=True),
    "triton": lambda: TritonRowMover(debug_checks=True),
    # Two lanes per program: groups wider than a program's lanes, one group per program.
    "triton_narrow": lambda: TritonRowMover(
        max_staged_moves=8, group_lanes=2, register_words=64, debug_checks=True
    ),
    # Groups above the staged cap: no one-launch segmentation, gather/scatter moves instead.
    "triton_capped": lambda: TritonRowMover(
        max_staged_moves=2, register_words=64, debug_checks=True
    ),
}


def needs_triton(mover_name: str, device: torch.device) -> None:
    if mover_name.startswith("triton"):
        requires_triton(device)


def random_buffers(num_slots: int, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """Rows of several widths, dtypes and alignments (16-byte vectors and single words)."""
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(num_slots, 2, 8, generator=gen).to(device, torch.bfloat16),  # 32 B rows
        torch.randn(num_slots, 3, generator=gen).to(device),  # 12 B rows: no vectors
        torch.randint(0, 256, (num_slots, 16), generator=gen, dtype=torch.uint8).to(device),
    )


def assert_moves_like_the_reference(
    move: Callable[[tuple[torch.Tensor, ...]], None],
    tgt: torch.Tensor,
    src: torch.Tensor,
    device: torch.device,
    seed: int = 0,
) -> None:
    buffers = random_buffers(NUM_SLOTS, device, seed)
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt, src)
    move(buffers)
    for i, (buf, want) in enumerate(zip(buffers, expected, strict=True)):
        assert torch.equal(raw(buf), raw(want)), f"buffer {i} differs"


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


def slots(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


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


def compaction_pairs(
    gen: torch.Generator, bs: int, num_nodes: int, num_steps: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    return accepted_path_moves(gen, bs, num_nodes, num_steps, NUM_SLOTS, device)


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


@pytest.mark.parametrize("max_staged_moves", [512, 4])  # one segment; gather/scatter
def test_a_long_cycle_without_a_hint_stays_exact(
    max_staged_moves: int, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(5)
    cycle = (torch.randperm(NUM_SLOTS - 1, generator=gen)[:40] + 1).tolist()
    tgt, src = cycle, cycle[1:] + cycle[:1]  # one 40-cycle: its closing edge spans every pair
    mover = TritonRowMover(max_staged_moves=max_staged_moves)
    assert_moves_like_the_reference(
        lambda bufs: mover.move(bufs, slots(tgt, device), slots(src, device)),
        slots(tgt, device),
        slots(src, device),
        device,
    )


def test_the_row_table_gives_vectors_only_to_16_byte_aligned_buffers(
    device: torch.device,
) -> None:
    padded = torch.zeros(8, 12, device=device)
    buffers = (
        torch.zeros(8, 4, device=device),  # 16 B rows and stride
        torch.zeros(8, device=device),  # 4 B rows
        padded[:, :4],  # 16 B rows, 48 B stride
        padded.new_zeros(8, 6)[:, :4],  # 16 B rows, 24 B stride
        torch.zeros(8, 2, 16, dtype=torch.bfloat16, device=device),
    )
    table = build_row_table(buffers)
    assert table.word_bytes == 4 and table.vector_words == 4
    assert table.vector_aligned.tolist() == [1, 0, 1, 0, 1]
    assert table.row_words.tolist() == [4, 1, 4, 4, 16]
    assert table.stride_words.tolist() == [4, 1, 12, 6, 16]
    odd = build_row_table((torch.zeros(8, 5, dtype=torch.uint8, device=device),))
    assert odd.word_bytes == 1 and odd.vector_words == 1 and odd.vector_aligned.tolist() == [0]


@given(
    row_bytes=st.sampled_from([4, 128, 1152, 2048, 4096, 12]),
    lanes=st.sampled_from([1, 8, 32, 64, 512]),
    num_segments=st.integers(1, 5000),
    register_words=st.sampled_from([2048, 8192, 16384]),
    min_programs=st.sampled_from([1, 128, 512, 4096]),
)
@settings(max_examples=60, deadline=None)
def test_tile_shapes_are_vector_multiples_that_cover_the_row_within_budget(
    row_bytes: int, lanes: int, num_segments: int, register_words: int, min_programs: int
) -> None:
    table = build_row_table((torch.zeros(4, row_bytes, dtype=torch.uint8),))
    tuning = Tuning(register_words=register_words, min_programs=min_programs)
    shape = tile_shape(table, lanes, num_segments, tuning)
    vec = table.vector_words
    assert shape.tile & (shape.tile - 1) == 0 and shape.tile % vec == 0
    assert shape.num_tiles * shape.tile >= table.max_row_words > (shape.num_tiles - 1) * shape.tile
    assert lanes * shape.tile <= max(register_words, lanes * vec)
    assert shape.num_warps in (2, 4, 8)


@pytest.mark.parametrize("hint", [None, 6])
@pytest.mark.parametrize("pairs", [6, 48, 384])
def test_a_small_move_is_one_launch_spread_over_many_programs_within_the_register_budget(
    pairs: int, hint: int | None
) -> None:
    # 64 buffers as in Llama-3.1-8B: small moves are latency-bound, so they must not fall back
    # to a handful of programs moving many rows each.
    buffers = tuple(torch.zeros(2, 8, 128, dtype=torch.bfloat16) for _ in range(64))
    launch = segment_launch(build_row_table(buffers), pairs, hint, Tuning())
    assert launch is not None  # one launch, no gather/scatter
    _, (segments, num_buffers, tiles), shape = launch
    assert num_buffers == 64 and segments * num_buffers * tiles >= 128
    assert shape.lanes * shape.tile <= 8192 and shape.tile * tiles >= 512  # 2 KiB rows


@pytest.mark.parametrize("max_staged_moves", [512, 4])  # one segment; gather/scatter
def test_tiles_past_a_narrow_row_move_nothing_and_wide_rows_move_exactly(
    max_staged_moves: int, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(11)
    num_slots = 24
    wide, narrow = (
        torch.randint(-(2**31), 2**31 - 1, shape, generator=gen, dtype=torch.int32).to(device)
        for shape in [(num_slots, 64), (num_slots,)]
    )
    buffers = (wide, narrow)
    order = torch.randperm(num_slots - 1, generator=gen)[:10] + 1
    tgt, src = order[:8], order[2:10]  # a chain: pair k reads what pair k + 2 writes
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt.to(device), src.to(device))
    # 4-word tiles: 16 tiles per row, 15 of them past the 1-word row of the second buffer
    mover = TritonRowMover(max_staged_moves=max_staged_moves, tile_words=4)
    mover.move(buffers, tgt.to(device), src.to(device))
    for buf, want in zip(buffers, expected, strict=True):
        assert torch.equal(buf, want)


@pytest.mark.parametrize("odd_bytes", [False, True])  # 4-byte words; single bytes
def test_a_grouped_move_over_many_buffers_of_odd_widths_stays_exact(
    odd_bytes: bool, device: torch.device
) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(7)
    rows: list[tuple[tuple[int, ...], torch.dtype]] = [
        ((2, 8), torch.bfloat16),  # 32 B: 16-byte vectors
        ((3,), torch.float32),  # 12 B: single words
        ((), torch.float32),  # one word per slot
        ((16,), torch.int32),  # the widest row: tiles past every other row are masked
    ]
    if odd_bytes:
        rows.append(((5,), torch.uint8))  # every buffer copied as single bytes
    buffers = tuple(
        torch.randint(0, 256, (NUM_SLOTS, max(1, torch.Size(shape).numel()) * dtype.itemsize),
                      generator=gen, dtype=torch.uint8).view(dtype).reshape(NUM_SLOTS, *shape)
        .to(device)
        for _ in range(2)
        for shape, dtype in rows
    )  # fmt: skip
    tgt, src = compaction_pairs(gen, bs=6, num_nodes=8, num_steps=3, device=device)
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt, src)
    # one group of 4 pairs per segment, 16-word register blocks: many segments and tiles
    mover = TritonRowMover(max_staged_moves=8, register_words=64, group_lanes=4)
    mover.move(buffers, tgt, src, independent_groups=4)
    for i, (buf, want) in enumerate(zip(buffers, expected, strict=True)):
        assert torch.equal(raw(buf), raw(want)), f"buffer {i} of {len(buffers)} differs"


def test_moves_of_one_pair_count_reuse_a_launch_shape_and_stay_exact(device: torch.device) -> None:
    requires_triton(device)
    gen = torch.Generator().manual_seed(12)
    mover = TritonRowMover()
    buffers = random_buffers(NUM_SLOTS, device, 3)
    expected = [buf.clone() for buf in buffers]
    for hint in (None, 3, None, 3):  # the same count, new pairs, with and without the hint
        order = torch.randperm(NUM_SLOTS - 1, generator=gen)[:9] + 1
        tgt = order[:6].to(device)
        src = torch.cat([order[1:3], order[6:9], order[5:6]]).to(device)  # chains in groups
        move_rows_reference(expected, tgt, src)
        mover.move(buffers, tgt, src, independent_groups=hint)
        for i, (buf, want) in enumerate(zip(buffers, expected, strict=True)):
            assert torch.equal(raw(buf), raw(want)), f"buffer {i} differs"


def count_kernels(fn: Callable[[], None]) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()  # compiles and builds the pointer table
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return len([event for event in prof.events() if event.device_type.name == "CUDA"])


@pytest.mark.parametrize("hint", [6, None])
@pytest.mark.parametrize("bs", [1, 64, 700])
def test_a_grouped_move_of_any_size_and_a_small_move_without_hint_are_one_kernel_launch(
    bs: int, hint: int | None, device: torch.device
) -> None:
    if device.type != "cuda":
        pytest.skip("counts CUDA kernels with the profiler")
    num_slots = bs * 8 + 1
    gen = torch.Generator().manual_seed(bs)
    windows = (torch.randperm(num_slots - 1, generator=gen) + 1)[: bs * 8].view(bs, 8)
    tgt = windows[:, :6].reshape(-1).to(device)
    src = windows[:, 2:].reshape(-1).to(device)  # w[k] ← w[k + 2]: chains inside each window
    buffers = tuple(torch.zeros(num_slots, 8, 128, dtype=torch.bfloat16, device=device)
                    for _ in range(4))  # fmt: skip
    if hint is None and bs * 6 > 512:
        pytest.skip("without the hint, moves above max_staged_moves take gather/scatter")
    mover = TritonRowMover()
    assert count_kernels(lambda: mover.move(buffers, tgt, src, independent_groups=hint)) == 1
