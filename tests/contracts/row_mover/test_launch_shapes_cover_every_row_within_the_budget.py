"""The Triton mover's row table and launch-shape heuristics: vectors only for aligned
buffers, tiles that cover the row within the register budget, small moves spread over
many programs, and (on CUDA) one kernel launch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.adapters.kernels.triton.kv_move_table import (
    Tuning,
    build_row_table,
    segment_launch,
    tile_shape,
)
from eagletree.adapters.memory.row_movers import TritonRowMover


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
