"""Request state: validation, stop conditions, the life cycle and its invariants, seeded coins."""

from __future__ import annotations

import pytest

from eagletree.domain.acceptance_stats import AcceptanceStats
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams

EOS = 2


def make_request(
    prompt: list[int] | None = None, max_new_tokens: int = 4, context: int = 64, **params: object
) -> Request:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, **params)  # type: ignore[arg-type]
    return Request(7, prompt if prompt is not None else [5, 6, 7], sampling, context)


def running(request: Request, row: int = 0) -> Request:
    request.admit(row, now=1.0)
    request.grow_window(request.num_tokens)
    request.commit(request.num_tokens)
    return request


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_new_tokens", 0), ("temperature", -0.5), ("temperature", float("nan")),
     ("top_k", 0), ("top_p", 0.0), ("top_p", 1.5)],
)  # fmt: skip
def test_sampling_params_reject_values_outside_their_range(field: str, value: object) -> None:
    values: dict[str, object] = {"max_new_tokens": 3, field: value}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**values)  # type: ignore[arg-type]


def test_an_empty_prompt_or_one_that_fills_the_context_is_refused_naming_the_request() -> None:
    with pytest.raises(ValueError, match="request 7: the prompt is empty"):
        make_request(prompt=[])
    with pytest.raises(ValueError, match="request 7: the prompt has 8 tokens"):
        make_request(prompt=list(range(8)), context=8)


def test_output_is_capped_by_max_new_tokens_and_by_the_context() -> None:
    assert make_request(max_new_tokens=4, context=64).max_total_len == 3 + 4
    assert make_request(max_new_tokens=40, context=10).max_total_len == 10


def test_eos_and_stop_tokens_finish_the_request_and_are_kept() -> None:
    request = running(make_request(max_new_tokens=10, stop_token_ids=frozenset({9})))
    assert request.append_tokens([4, EOS, 8], eos_token_ids={EOS}, now=2.0) == 2
    assert request.output_ids == [4, EOS]
    assert request.finish_reason is FinishReason.EOS
    request = running(make_request(max_new_tokens=10, stop_token_ids=frozenset({9})))
    request.append_tokens([9], eos_token_ids={EOS}, now=2.0)
    assert request.finish_reason is FinishReason.STOP


def test_a_multi_token_step_is_truncated_at_max_new_tokens() -> None:
    request = running(make_request(max_new_tokens=3))
    assert request.append_tokens([4, 4, 4, 4, 4], eos_token_ids=(), now=2.0) == 3
    assert request.output_ids == [4, 4, 4]
    assert request.finish_reason is FinishReason.LENGTH


def test_retract_keeps_every_token_and_frees_the_window() -> None:
    request = running(make_request(max_new_tokens=8), row=3)
    request.append_tokens([11, 12], eos_token_ids=(), now=2.0)
    request.grow_window(request.allocated_len + 4)
    assert request.release() == (3, 3 + 4)
    request.retract()
    assert request.status is RequestStatus.WAITING
    assert (request.row, request.committed_len, request.allocated_len) == (None, 0, 0)
    assert request.fill_ids() == [5, 6, 7, 11, 12]
    assert request.num_retractions == 1


def test_finish_records_the_time_and_requires_a_released_row() -> None:
    request = running(make_request())
    request.mark_aborted()
    with pytest.raises(AssertionError):
        request.finish(now=3.0)
    request.release()
    request.finish(now=3.0)
    assert request.status is RequestStatus.FINISHED
    assert request.times.finished == 3.0
    assert request.finish_reason is FinishReason.ABORT


def test_invariants_catch_committing_past_the_window() -> None:
    request = running(make_request())
    with pytest.raises(AssertionError):
        request.commit(1)  # the window ends at the committed length


def test_window_never_shrinks() -> None:
    request = running(make_request())
    with pytest.raises(AssertionError):
        request.grow_window(request.allocated_len - 1)


def test_coin_reservations_are_consecutive_and_the_seed_is_the_params_seed() -> None:
    request = make_request(temperature=1.0, seed=5)
    assert [request.take_coins(2), request.take_coins(4), request.take_coins(0)] == [0, 2, 6]
    assert request.coin_offset == 6
    assert request.coin_seed == 5
    assert make_request(temperature=1.0, seed=-3).coin_seed == -3
    assert make_request(temperature=1.0, seed=1 << 63).coin_seed == -(1 << 63)  # low 64 bits
    with pytest.raises(ValueError, match="-1 coins"):
        request.take_coins(-1)


def test_unseeded_requests_draw_distinct_fixed_seeds() -> None:
    first, second = make_request(temperature=1.0), make_request(temperature=1.0)
    assert first.coin_seed == first.coin_seed  # drawn once
    assert first.coin_seed != second.coin_seed
    assert -(1 << 63) <= first.coin_seed < (1 << 63)


def test_acceptance_stats_count_steps_by_emitted_tokens() -> None:
    stats = AcceptanceStats.from_counts([1, 3, 3, 2])
    assert stats.histogram == (0, 1, 1, 2)
    assert stats.mean_accept_length == pytest.approx(9 / 4)
    assert AcceptanceStats.from_counts([]).mean_accept_length == 0.0
