"""Small KV pools of every kind × row mover × storage dtype for the pool contract, and
their buffers as raw bytes, so that comparisons are bit-exact."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import HealthCheck, settings

from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
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
