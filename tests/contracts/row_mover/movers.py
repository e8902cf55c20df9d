"""RowMovers on their own, for the mover tests: movers with the grouping hint checked,
random buffers of several row widths, and the bit-exact comparison with
``domain.kv_move.move_rows_reference``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import HealthCheck, settings

from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.domain.kv_move import move_rows_reference
from tests.conftest import requires_triton
from tests.contracts.kv_pool.moves import accepted_path_moves
from tests.contracts.kv_pool.pools import raw

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


def slots(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def compaction_pairs(
    gen: torch.Generator, bs: int, num_nodes: int, num_steps: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    return accepted_path_moves(gen, bs, num_nodes, num_steps, NUM_SLOTS, device)
