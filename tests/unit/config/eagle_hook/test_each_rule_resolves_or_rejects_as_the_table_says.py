"""Tests of the eagle-family rules: one table row per rule, warning and error texts
asserted."""

from __future__ import annotations

import pytest

from eagletree.config.eagle_hook import resolve_speculative
from eagletree.domain.errors import ConfigurationError
from tests.unit.config.eagle_hook.rejecting import REJECTING
from tests.unit.config.eagle_hook.resolving import RESOLVING
from tests.unit.config.eagle_hook.table import Case, settings_of


@pytest.mark.parametrize("case", RESOLVING, ids=[case.name for case in RESOLVING])
def test_a_rule_resolves_the_settings_as_the_table_says(case: Case) -> None:
    resolved = resolve_speculative(settings_of(case), case.target)
    actual = {name: getattr(resolved, name) for name in case.expect}
    assert actual == case.expect
    assert resolved.warnings == case.warnings


@pytest.mark.parametrize("case", REJECTING, ids=[case.name for case in REJECTING])
def test_a_contradiction_is_rejected_with_what_to_change(case: Case) -> None:
    assert case.error is not None
    with pytest.raises(ConfigurationError) as raised:
        resolve_speculative(settings_of(case), case.target)
    assert case.error in str(raised.value)


def test_the_table_covers_at_least_twenty_five_cases() -> None:
    assert len(RESOLVING) + len(REJECTING) >= 25
