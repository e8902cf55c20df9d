"""The largest tree a beam can fill: ``max_draft_tokens`` against a count of its
proposals."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eagletree.domain.draft_shape import max_draft_tokens


def _tree_capacity(num_steps: int, topk: int) -> int:
    """Nodes a beam of width k can propose: k at the first step, k children of k beams after."""
    frontier, proposed = 1, 0
    for _ in range(num_steps):
        proposed += frontier * topk
        frontier = topk
    return 1 + proposed


@given(st.integers(1, 8), st.integers(1, 8))
def test_the_tree_size_limit_counts_the_beam_proposals(num_steps: int, topk: int) -> None:
    assert max_draft_tokens(num_steps, topk) == _tree_capacity(num_steps, topk)
