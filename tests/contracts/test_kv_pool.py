"""Every KV pool × row mover × storage dtype must move every buffer it owns exactly like the
reference (``domain.kv_move.move_rows_reference``), bit for bit. Triton movers run under
``TRITON_INTERPRET=1`` on CPU (small shapes) and natively on CUDA."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.domain.compaction import accepted_move_plan
from eagletree.domain.kv_move import move_rows_reference
from eagletree.ports.memory import KVPool, RowMover
from tests.conftest import requires_triton

SIZE = 23  # slots 1..23; row 0 is the dummy
FP8 = torch.float8_e4m3fn
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": FP8}
MOVERS: dict[str, Callable[[], RowMover]] = {
    "torch": TorchRowMover,
    "triton": TritonRowMover,
    # Tiny caps: moves (or groups) of up to 4 pairs take the kernel, a segment per group of
    # narrow register blocks; larger ones the gather/scatter fallback.
    "triton_capped": lambda: TritonRowMover(max_staged_moves=4, register_words=64, group_lanes=4),
}
POOLS = ["mha", "mla", "dsa"]
FAST = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def make_pool(
    kind: str,
    mover: RowMover,
    dtype_name: str,
    device: torch.device,
    layers: int = 2,
    page_size: int = 1,
    checks: bool = True,
) -> KVPool:
    """A small pool; "fp8" means fp8 storage (MHA: store_dtype, MLA/DSA: the buffer dtype)."""
    dtype = DTYPES[dtype_name]
    compute = torch.bfloat16 if dtype == FP8 else dtype
    store = FP8 if dtype == FP8 else None
    page = page_size
    if kind == "mha":
        return MHAKVPool(SIZE, layers, 2, 4, 3, compute, device, mover, store, page, checks)
    if kind == "mla":
        return MLAKVPool(SIZE, layers, 8, 4, dtype, device, mover, page, checks)
    assert kind == "dsa"
    return DSAKVPool(SIZE, layers, 8, 4, dtype, device, mover, 16, page, checks)


def raw(buf: torch.Tensor) -> torch.Tensor:
    """The buffer's bytes, (num_rows, row_bytes), so that comparisons are bit-exact."""
    return buf.reshape(buf.shape[0], -1).view(torch.uint8)


def fill_random(pool: KVPool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for buf in pool.buffers():
        view = raw(buf)
        view.copy_(torch.randint(0, 256, view.shape, generator=gen, dtype=torch.uint8))


def fill_slot_ids(pool: KVPool) -> None:
    """Every byte of row r of buffer b is (r + 31·b) mod 256: a row names its slot."""
    for b, buf in enumerate(pool.buffers()):
        ids = (torch.arange(buf.shape[0], device=buf.device) + 31 * b) % 256
        raw(buf).copy_(ids.to(torch.uint8)[:, None].expand_as(raw(buf)))


def reference_move(pool: KVPool, tgt: torch.Tensor, src: torch.Tensor) -> list[torch.Tensor]:
    """Byte copies of the pool's buffers after the reference move."""
    after = [raw(buf).clone() for buf in pool.buffers()]
    move_rows_reference(after, tgt, src)
    return after


def assert_bytes_equal(pool: KVPool, expected: Sequence[torch.Tensor]) -> None:
    actual = pool.buffers()
    assert len(actual) == len(expected)
    for i, (buf, want) in enumerate(zip(actual, expected, strict=True)):
        assert torch.equal(raw(buf), want), f"buffer {i} of {len(actual)} differs"


@st.composite
def move_sets(draw: st.DrawFn, num_rows: int = SIZE + 1) -> tuple[list[int], list[int]]:
    """Distinct targets, sources anywhere (often another pair's target: chains and cycles),
    plus a few (0, 0) padding pairs, in any order."""
    targets = draw(st.lists(st.integers(1, num_rows - 1), unique=True, max_size=num_rows - 1))
    any_slot = st.integers(0, num_rows - 1)
    source = st.one_of(st.sampled_from(targets), any_slot) if targets else any_slot
    sources = draw(st.lists(source, min_size=len(targets), max_size=len(targets)))
    pairs = list(zip(targets, sources, strict=True)) + [(0, 0)] * draw(st.integers(0, 3))
    pairs = draw(st.permutations(pairs))
    return [t for t, _ in pairs], [s for _, s in pairs]


def slots(
    values: list[int], device: torch.device, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


pool_matrix = pytest.mark.parametrize(
    ("pool_kind", "mover_name", "dtype_name"),
    [(p, m, d) for p in POOLS for m in MOVERS for d in DTYPES],
)


def needs_triton(mover_name: str, device: torch.device) -> None:
    if mover_name.startswith("triton"):
        requires_triton(device)


@pool_matrix
@FAST
@given(moves=move_sets(), seed=st.integers(0, 2**16))
def test_random_overlapping_moves_match_the_reference_bit_for_bit(
    pool_kind: str,
    mover_name: str,
    dtype_name: str,
    device: torch.device,
    moves: tuple[list[int], list[int]],
    seed: int,
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_random(pool, seed)
    tgt, src = slots(moves[0], device), slots(moves[1], device, torch.int32)
    expected = reference_move(pool, tgt.long(), src.long())
    pool.move_kv_cache(tgt, src)
    assert_bytes_equal(pool, expected)


@pool_matrix
def test_every_buffer_the_pool_owns_receives_its_source_rows(
    pool_kind: str, mover_name: str, dtype_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_slot_ids(pool)
    # A compaction-shaped move: path [0, 2, 5] in a window, a 3-cycle, a chain and padding.
    tgt = [4, 5, 6, 10, 11, 12, 20, 21, 0, 0]
    src = [4, 6, 9, 11, 12, 10, 21, 22, 0, 0]
    before = [raw(buf).clone() for buf in pool.buffers()]
    pool.move_kv_cache(slots(tgt, device), slots(src, device))
    moved = dict(zip(tgt, src, strict=True))
    for b, (buf, old) in enumerate(zip(pool.buffers(), before, strict=True)):
        for row in range(buf.shape[0]):
            want = old[moved.get(row, row)]
            assert torch.equal(raw(buf)[row], want), f"buffer {b}, row {row}"


@pytest.mark.parametrize("pool_kind", POOLS)
def test_buffers_lists_every_slot_indexed_tensor(pool_kind: str, device: torch.device) -> None:
    pool = make_pool(pool_kind, TorchRowMover(), "bf16", device, layers=3)
    listed = {buf.data_ptr() for buf in pool.buffers()}
    assert len(listed) == len(pool.buffers())
    owned: list[torch.Tensor] = []
    for layer in range(pool.geometry.layer_num):
        if isinstance(pool, MHAKVPool):
            owned += [pool.get_key_buffer(layer), pool.get_value_buffer(layer)]
        if isinstance(pool, MLAKVPool | DSAKVPool):
            owned.append(pool.get_kv_buffer(layer))
        if isinstance(pool, DSAKVPool):
            owned += [pool.get_index_k_buffer(layer), pool.get_index_scale_buffer(layer)]
    assert {buf.data_ptr() for buf in owned} == listed


@pytest.mark.parametrize("pool_kind", POOLS)
@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_a_page_size_above_one_moves_token_rows(
    pool_kind: str, mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), "fp16", device, page_size=4)
    fill_random(pool, 3)
    tgt, src = slots([25, 26, 1, 2], device), slots([26, 1, 3, 25], device)
    expected = reference_move(pool, tgt, src)
    pool.move_kv_cache(tgt, src)
    assert all(buf.shape[0] == SIZE + 4 for buf in pool.buffers())
    assert_bytes_equal(pool, expected)


class RecordingMover:
    """A RowMover fake that delegates to the torch mover and records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (number of buffers, number of moves)
        self.groups: list[int | None] = []

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        self.calls.append((len(buffers), tgt.numel()))
        self.groups.append(independent_groups)
        TorchRowMover().move(buffers, tgt, src, independent_groups=independent_groups)


@pytest.mark.parametrize("pool_kind", POOLS)
def test_one_mover_call_moves_all_buffers(pool_kind: str, device: torch.device) -> None:
    mover = RecordingMover()
    pool = make_pool(pool_kind, mover, "fp32", device, layers=3)
    pool.move_kv_cache(slots([1, 2], device), slots([2, 3], device))
    assert mover.calls == [(len(pool.buffers()), 2)]


@pytest.mark.parametrize("pool_kind", POOLS)
@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_an_empty_move_changes_nothing(
    pool_kind: str, mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), "bf16", device)
    fill_random(pool, 5)
    before = [raw(buf).clone() for buf in pool.buffers()]
    empty = torch.empty(0, dtype=torch.int64, device=device)
    pool.move_kv_cache(empty, empty)
    assert_bytes_equal(pool, before)


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


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16", "fp8"])
def test_mha_set_kv_buffer_converts_to_the_storage_dtype(
    dtype_name: str, device: torch.device
) -> None:
    pool = make_pool("mha", TorchRowMover(), dtype_name, device)
    assert isinstance(pool, MHAKVPool)
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(3, 2, 4, generator=gen).to(device)
    v = torch.randn(3, 2, 3, generator=gen).to(device)
    loc = slots([5, 1, 9], device)
    pool.set_kv_buffer(1, loc, k, v)
    stored_k = pool.get_key_buffer(1)[loc]
    assert stored_k.dtype == pool.store_dtype
    # Readers convert gathered rows to the compute dtype.
    dtype = pool.geometry.dtype
    torch.testing.assert_close(stored_k.to(dtype), k.to(pool.store_dtype).to(dtype), rtol=0, atol=0)
    assert torch.equal(raw(pool.get_value_buffer(1)[loc]), raw(v.to(pool.store_dtype)))


def test_mla_writes_latent_and_rope_into_one_row(device: torch.device) -> None:
    pool = make_pool("mla", TorchRowMover(), "bf16", device)
    assert isinstance(pool, MLAKVPool)
    gen = torch.Generator().manual_seed(4)
    latent = torch.randn(2, 1, 8, generator=gen).to(device, torch.bfloat16)
    rope = torch.randn(2, 1, 4, generator=gen).to(device, torch.bfloat16)
    loc = slots([7, 3], device)
    pool.set_mla_kv_buffer(0, loc, latent, rope)
    assert torch.equal(pool.get_kv_buffer(0)[loc], torch.cat([latent, rope], dim=-1))
    pool.set_kv_buffer(1, loc, torch.cat([rope, latent], dim=-1))
    assert torch.equal(pool.get_kv_buffer(1)[loc], torch.cat([rope, latent], dim=-1))


def test_dsa_indexer_keys_and_scales_move_in_lockstep_with_the_latent(
    device: torch.device,
) -> None:
    pool = make_pool("dsa", TorchRowMover(), "bf16", device)
    assert isinstance(pool, DSAKVPool)
    gen = torch.Generator().manual_seed(6)
    keys = torch.randn(3, 16, generator=gen).to(device).to(FP8)
    scales = torch.rand(3, generator=gen).to(device)
    pool.set_index_k(0, slots([4, 5, 6], device), keys, scales)
    pool.move_kv_cache(slots([1, 2, 3], device), slots([6, 4, 5], device))
    moved = slots([2, 3, 1], device)  # where slots 4, 5, 6 went
    assert torch.equal(raw(pool.get_index_k_buffer(0)[moved]), raw(keys))
    assert torch.equal(pool.get_index_scale_buffer(0)[moved], scales)
    with pytest.raises(TypeError, match="float8"):
        pool.set_index_k(0, slots([1], device), keys.float()[:1], scales[:1])


@pytest.mark.parametrize("mover_name", list(MOVERS))
@FAST
@given(moves=move_sets(num_rows=30), seed=st.integers(0, 2**16))
def test_movers_copy_rows_of_any_shape_dtype_and_stride(
    mover_name: str, device: torch.device, moves: tuple[list[int], list[int]], seed: int
) -> None:
    needs_triton(mover_name, device)
    gen = torch.Generator().manual_seed(seed)
    padded = torch.randn(30, 6, generator=gen).to(device)
    buffers = (
        torch.randint(0, 256, (30, 5), generator=gen, dtype=torch.uint8).to(device),  # odd bytes
        torch.randn(30, generator=gen).to(device),  # one scalar per slot
        torch.randn(30, 3, 3, generator=gen).to(device, torch.float16),
        torch.randn(30, 2, generator=gen).to(device, torch.float64),
        padded[:, :4],  # rows contiguous, slot stride wider than a row
        torch.randn(30, 3, generator=gen).to(device)[:, 1],  # one element per slot, strided
    )
    tgt, src = slots(moves[0], device), slots(moves[1], device)
    expected = [buf.clone() for buf in buffers]
    move_rows_reference(expected, tgt, src)
    MOVERS[mover_name]().move(buffers, tgt, src)
    for buf, want in zip(buffers, expected, strict=True):
        assert torch.equal(raw(buf.contiguous()), raw(want.contiguous()))


def test_the_triton_mover_rejects_buffers_that_share_memory(device: torch.device) -> None:
    requires_triton(device)
    kv = torch.zeros(8, 2, 4, device=device)
    with pytest.raises(ValueError, match="overlap"):
        TritonRowMover().move((kv, kv[:, 1]), slots([1], device), slots([2], device))


def compaction_plan(
    num_requests: int, window: int, depth: int, seed: int
) -> tuple[list[int], list[int]]:
    """Packed (tgt, src) of accepted paths: request b moves w[path[k]] to w[k], path increasing."""
    gen = torch.Generator().manual_seed(seed)
    tgt: list[int] = []
    src: list[int] = []
    for b in range(num_requests):
        start = 1 + b * window
        accepted = int(torch.randint(1, depth + 2, (1,), generator=gen))
        path = [
            0,
            *sorted(torch.randperm(window - 1, generator=gen)[: accepted - 1].add(1).tolist()),
        ]
        tgt += [start + k for k in range(len(path))]
        src += [start + node for node in path]
    padding = num_requests * (depth + 1) - len(tgt)
    return tgt + [0] * padding, src + [0] * padding


@pytest.mark.parametrize("mover_name", list(MOVERS))
def test_compaction_plans_of_many_requests_match_the_reference(
    mover_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool("mha", MOVERS[mover_name](), "bf16", device)
    tgt, src = compaction_plan(num_requests=3, window=7, depth=3, seed=1)
    fill_random(pool, 9)
    expected = reference_move(pool, slots(tgt, device), slots(src, device))
    pool.move_kv_cache(slots(tgt, device), slots(src, device))
    assert_bytes_equal(pool, expected)


def accepted_path_moves(
    gen: torch.Generator,
    bs: int,
    num_nodes: int,
    num_steps: int,
    num_slots: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A real ``accepted_move_plan`` over random accepted paths and scattered verify windows:
    pair ``b·(S+1) + t`` moves node t of request b, so groups of S + 1 pairs are requests."""
    rows, lengths = [], []
    for b in range(bs):
        length = int(torch.randint(0, num_steps + 1, (1,), generator=gen))
        nodes = torch.randperm(num_nodes - 1, generator=gen)[:length].add(1).sort().values
        path = [0, *nodes.tolist()]
        rows.append([b * num_nodes + node for node in path] + [-1] * (num_steps - length))
        lengths.append(length)
    verify_slots = torch.randperm(num_slots - 1, generator=gen)[: bs * num_nodes] + 1
    return accepted_move_plan(
        torch.tensor(rows, dtype=torch.int32, device=device),
        torch.tensor(lengths, dtype=torch.int32, device=device),
        verify_slots.to(device),
        num_draft_tokens=num_nodes,
    )


@pool_matrix
def test_compaction_moves_with_the_workers_grouping_hint_match_the_reference(
    pool_kind: str, mover_name: str, dtype_name: str, device: torch.device
) -> None:
    needs_triton(mover_name, device)
    pool = make_pool(pool_kind, MOVERS[mover_name](), dtype_name, device)
    fill_random(pool, 13)
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):  # the workers' call: groups of S + 1 = 4 pairs, one request each
        tgt, src = accepted_path_moves(gen, 4, 5, 3, SIZE + 1, device)
        expected = reference_move(pool, tgt, src)
        pool.move_kv_cache(tgt, src, independent_groups=4)
        assert_bytes_equal(pool, expected)


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
