"""The prompt-lookup baseline: what it proposes, and its exact greedy replay."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eagletree.app.training.prompt_lookup import LookupDrafter, simulate


def test_it_proposes_what_followed_the_latest_earlier_match_of_the_longest_ngram() -> None:
    context = [1, 2, 3, 9, 8, 1, 2, 3, 7, 5, 4, 1, 2, 3]
    assert LookupDrafter(2).propose(context) == [7, 5]  # the latest [1, 2, 3], not the first
    assert LookupDrafter(9).propose(context) == [7, 5, 4, 1, 2, 3]  # up to the context's end
    # no earlier [6, 2, 3] or [2, 3]… ending in 6: falls back to the 1-gram [6]
    assert LookupDrafter(3).propose([6, 0, 4, 5, 6]) == [0, 4, 5]
    assert LookupDrafter(3).propose([1, 2, 3, 4]) == []  # nothing repeats
    # the 3-gram's match and the 2-gram's latest one differ: max_ngram decides
    context = [1, 2, 3, 8, 4, 2, 3, 9, 1, 2, 3]
    assert LookupDrafter(3).propose(context) == [8, 4, 2]
    assert LookupDrafter(3, max_ngram=2).propose(context) == [9, 1, 2]


def test_a_continuation_that_repeats_the_prompt_is_accepted_in_full_steps() -> None:
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 10]
    continuation = [11, 12, 13, 14, 15, 16, 17]  # the prefill emits 11, then the copy
    # after [.., 10, 11] the lookup proposes 12 13 14: all accepted, plus the bonus 15; then
    # 16 17 from [.., 15]; the last step is cut at the continuation's end
    assert simulate(LookupDrafter(3), prompt, continuation) == [4, 2]


def test_tokens_never_seen_before_accept_nothing() -> None:
    assert simulate(LookupDrafter(4), [1, 2, 3], [50, 51, 52, 53]) == [1, 1, 1]


@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    continuation=st.lists(st.integers(0, 5), max_size=24),
    num_draft=st.integers(1, 6),
)
def test_the_replay_emits_every_token_once_within_the_draft_length(
    prompt: list[int], continuation: list[int], num_draft: int
) -> None:
    emitted = simulate(LookupDrafter(num_draft), prompt, continuation)
    assert sum(emitted) == max(len(continuation) - 1, 0)  # the first token is the prefill's
    assert all(1 <= e <= num_draft + 1 for e in emitted)
    done = min(1, len(continuation))
    for e in emitted:  # every accepted token is the one the lookup proposed there
        proposal = LookupDrafter(num_draft).propose([*prompt, *continuation[:done]])
        assert continuation[done : done + e - 1] == proposal[: e - 1]
        done += e


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="num_draft"):
        LookupDrafter(0)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupDrafter(2, max_ngram=1, min_ngram=2)
