"""`eagletree bench --configs`: the spec grammar, its errors, and plain joining speculative runs."""

from __future__ import annotations

import pytest

from eagletree.app.bench.configs import PLAIN, BenchConfig, parse_config, parse_configs
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.errors import ConfigurationError


@pytest.mark.parametrize(
    ("spec", "expected", "name"),
    [
        ("plain", BenchConfig(DraftShape(0, 1, 1)), "plain"),
        ("chain:S3", BenchConfig(DraftShape(3, 1, 4)), "chain S3"),
        ("tree:S5,k4,N8", BenchConfig(DraftShape(5, 4, 8)), "tree S5 k4 N8"),
        (" tree:N32,k8,S6 ", BenchConfig(DraftShape(6, 8, 32)), "tree S6 k8 N32"),
    ],
)
def test_specs_parse_into_configurations_named_as_in_the_tables(
    spec: str, expected: BenchConfig, name: str
) -> None:
    config = parse_config(spec)
    assert config == expected
    assert config.name == name
    assert config.speculative is not expected.shape.is_plain
    assert config.max_tokens_per_step == expected.shape.num_steps + 1


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("beam:S3", "unknown kind 'beam'"),
        ("plain:S1", "plain takes no parameters"),
        ("chain:S3,k2", "a chain takes S only"),
        ("chain:", "'' is not S<n>"),
        ("tree:S5,k4", "missing N"),
        ("tree:S5,k4,N8,S2", "S is given twice"),
        ("tree:S0,k4,N8", "S must be at least 1"),
        ("tree:S5,x4,N8", "'x4' is not S<n>"),
        ("tree:S2,k2,N8", "exceeds the 6 candidates"),  # 2 + 1·2² candidates under the root
        ("tree:S2,k2,N1", "N >= 2"),
    ],
)
def test_bad_specs_name_the_item_and_the_problem(spec: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse_config(spec)
    message = str(error.value)
    assert repr(spec) in message and why in message
    assert "\n" not in message


def test_plain_is_measured_first_whenever_a_configuration_speculates() -> None:
    configs = parse_configs(["tree:S5,k4,N8", "chain:S3", "plain", "chain:S3"])
    assert [c.name for c in configs] == ["plain", "tree S5 k4 N8", "chain S3"]
    assert parse_configs(["chain:S2"])[0] == PLAIN
    assert parse_configs(["plain"]) == [PLAIN]


def test_an_empty_list_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        parse_configs([])


def test_the_adaptive_policy_comes_last_over_every_fixed_configuration() -> None:
    configs = parse_configs(["tree:S5,k4,N8", "chain:S3"], adaptive=True)
    assert [c.name for c in configs] == ["plain", "tree S5 k4 N8", "chain S3", "adaptive"]
    adaptive = configs[-1]
    assert adaptive.shape == DraftShape(5, 4, 8)  # the first speculative one is its default
    assert adaptive.candidates == (DraftShape(0, 1, 1), DraftShape(5, 4, 8), DraftShape(3, 1, 4))
    assert adaptive.max_tokens_per_step == 6
    with pytest.raises(ConfigurationError, match="needs a speculative config"):
        parse_configs(["plain"], adaptive=True)
