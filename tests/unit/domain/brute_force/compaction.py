"""Compaction in plain Python: the (tgt, src) pairs of the accepted paths, and a KV
pool whose payload is the slot id it was written at."""

from __future__ import annotations


def move_pairs_reference(
    accept_index: list[list[int]],
    accept_length: list[int],
    verify_slots: list[int],
    num_draft_tokens: int,
) -> list[tuple[int, int]]:
    """(tgt, src) for every accepted node t of every request: window slot t ← the node's slot."""
    return [
        (verify_slots[b * num_draft_tokens + t], verify_slots[accept_index[b][t]])
        for b in range(len(accept_index))
        for t in range(accept_length[b] + 1)
    ]


class FakeKVPool:
    """A KV pool whose payload is the slot id it was written at; moves gather then scatter."""

    def __init__(self, num_slots: int) -> None:
        self.payload = list(range(num_slots))

    def move(self, pairs: list[tuple[int, int]]) -> None:
        values = [self.payload[src] for _, src in pairs]
        for (tgt, _), value in zip(pairs, values, strict=True):
            self.payload[tgt] = value
