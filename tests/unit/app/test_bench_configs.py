"""`eagletree bench --configs`: the spec grammar, its errors, and plain joining speculative runs."""

from __future__ import annotations

import pytest

from eagletree.app.bench.configs import PLAIN, BenchConfig, parse_config, parse_configs
from eagletree.domain.errors import ConfigurationError


@pytest.mark.parametrize(
    ("spec", "expected", "name"),
    [
        ("plain", BenchConfig("plain"), "plain"),
        ("chain:S3", BenchConfig("chain", 3, 1, 4), "chain S3 k1 N4"),
        ("tree:S5,k4,N8", BenchConfig("tree", 5, 4, 8), "tree S5 k4 N8"),
        (" tree:N32,k8,S6 ", BenchConfig("tree", 6, 8, 32), "tree S6 k8 N32"),
    ],
)
def test_specs_parse_into_configurations_named_as_in_the_tables(
    spec: str, expected: BenchConfig, name: str
) -> None:
    config = parse_config(spec)
    assert config == expected
    assert config.name == name
    assert config.speculative is (expected.kind != "plain")
    assert config.max_tokens_per_step == expected.num_steps + 1


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
        ("tree:S2,k2,N8", "N must be in 2..7"),  # root + 2 + 1·2² = 7 nodes at most
        ("tree:S2,k2,N1", "N must be in 2..7"),
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
    assert [c.name for c in configs] == ["plain", "tree S5 k4 N8", "chain S3 k1 N4"]
    assert parse_configs(["chain:S2"])[0] == PLAIN
    assert parse_configs(["plain"]) == [PLAIN]


def test_an_empty_list_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        parse_configs([])
