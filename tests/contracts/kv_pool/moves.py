"""Row moves for the pool and mover contracts: random overlapping move sets, and the
packed moves of accepted paths (also used by tests/contracts/row_mover/)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from eagletree.domain.compaction import accepted_move_plan
from tests.contracts.kv_pool.pools import SIZE


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
