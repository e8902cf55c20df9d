"""Engine input validation: a bad prompt or max_new_tokens raises a ValueError naming
the request, and nothing is queued."""

from __future__ import annotations

import pytest

from tests.integration.engine.fake_engines import fake_engine


@pytest.mark.parametrize(
    ("prompts", "max_new_tokens", "message"),
    [
        ([[1, 2], []], 4, r"request 1: the prompt is empty"),
        ([[1] * 48], 4, r"request 0: the prompt has 48 tokens but the context holds 48"),
        ([[1, 2]], 0, r"max_new_tokens must be >= 1, got 0"),
        ([[1, 2], [3, 32]], 4, r"request 1: token id 32 at position 1 is outside the vocab"),
        ([[1, -1]], 4, r"request 0: token id -1 at position 1 is outside the vocabulary"),
        ([[1, 2], [3, 4]], 200, r"request 0: needs up to 48 KV slots .* pool has 40"),
    ],
)
def test_bad_input_raises_value_error_naming_the_request_and_queues_nothing(
    prompts: list[list[int]], max_new_tokens: int, message: str
) -> None:
    engine, _ = fake_engine(pool_size=40)
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, max_new_tokens=max_new_tokens)
    assert not engine.has_work()
