"""How a pool calls its mover: one call for all buffers (none for a zero-layer pool),
slots checked first, the independent-groups promise handed on, and on CUDA a small
Triton move in one kernel launch."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.domain.kv_move import move_rows_reference
from tests.contracts.kv_pool.pools import (
    POOLS,
    SIZE,
    RecordingMover,
    assert_bytes_equal,
    fill_random,
    make_pool,
    raw,
    slots,
)


@pytest.mark.parametrize("pool_kind", POOLS)
def test_one_mover_call_moves_all_buffers(pool_kind: str, device: torch.device) -> None:
    mover = RecordingMover()
    pool = make_pool(pool_kind, mover, "fp32", device, layers=3)
    pool.move_kv_cache(slots([1, 2], device), slots([2, 3], device))
    assert mover.calls == [(len(pool.buffers()), 2)]


@pytest.mark.parametrize("pool_kind", POOLS)
def test_a_zero_layer_pool_returns_at_once(pool_kind: str, device: torch.device) -> None:
    mover = RecordingMover()
    pool = make_pool(pool_kind, mover, "fp16", device, layers=0)
    assert pool.buffers() == []
    pool.move_kv_cache(slots([10_000], device), slots([-5], device))  # not even checked
    assert mover.calls == []


@pytest.mark.parametrize("pool_kind", POOLS)
@pytest.mark.parametrize("which", ["target", "source"])
@pytest.mark.parametrize("bad", [SIZE + 1, -1])
def test_an_out_of_range_slot_raises_index_error_naming_value_and_range(
    pool_kind: str, which: str, bad: int, device: torch.device
) -> None:
    pool = make_pool(pool_kind, TorchRowMover(), "fp32", device)
    fill_random(pool, 1)
    before = [raw(buf).clone() for buf in pool.buffers()]
    good = slots([1, 2], device)
    wrong = slots([3, bad], device)
    tgt, src = (wrong, good) if which == "target" else (good, wrong)
    with pytest.raises(IndexError, match=rf"{which} slot {bad} .*\[0, {SIZE + 1}\)"):
        pool.move_kv_cache(tgt, src)
    assert_bytes_equal(pool, before)


@pytest.mark.parametrize("pool_kind", POOLS)
def test_a_small_triton_move_is_one_kernel_launch(pool_kind: str, device: torch.device) -> None:
    if device.type != "cuda":
        pytest.skip("counts CUDA kernels with the profiler")
    from torch.profiler import ProfilerActivity, profile

    pool = make_pool(pool_kind, TritonRowMover(), "bf16", device, layers=4, checks=False)
    tgt, src = slots([1, 2, 3, 4, 5, 0], device), slots([1, 3, 4, 7, 9, 0], device)
    pool.move_kv_cache(tgt, src)  # compiles and builds the pointer table
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pool.move_kv_cache(tgt, src)
        torch.cuda.synchronize()
    kernels = [event.name for event in prof.events() if event.device_type.name == "CUDA"]
    assert len(kernels) == 1, kernels


@pytest.mark.parametrize("pool_kind", POOLS)
def test_the_pool_hands_the_independent_groups_promise_to_its_mover(
    pool_kind: str, device: torch.device
) -> None:
    mover = RecordingMover()
    pool = make_pool(pool_kind, mover, "fp32", device, layers=2)
    # two groups of 3 pairs; each group overlaps only itself (a chain inside its window)
    tgt, src = [1, 2, 3, 7, 8, 9], [2, 3, 4, 8, 9, 10]
    expected = [buf.clone() for buf in pool.buffers()]
    move_rows_reference(expected, slots(tgt, device), slots(src, device))
    pool.move_kv_cache(slots(tgt, device), slots(src, device), independent_groups=3)
    assert mover.groups == [3]
    for got, want in zip(pool.buffers(), expected, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
