"""How speculation is resolved, whatever the rule: every warning logged as well as
kept, the chosen defaults logged at info, the result frozen and deterministic, the
settings left alone."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from eagletree.config.eagle_hook import ResolvedSpeculative, resolve_speculative
from eagletree.config.settings import EngineSettings
from tests.unit.config.eagle_hook.table import DEEPSEEK_V3, DRAFT, LLAMA, ROOMY, spec

MAX_RUNNING_WARNING = (
    "memory.max_running_requests is unset; speculation uses 48 "
    "(set memory.max_running_requests to change it)"
)


def test_every_warning_is_logged_as_well_as_kept(caplog: pytest.LogCaptureFixture) -> None:
    # two warnings: MTP layers from a draft path of their own, and the v1 fallback of pages
    settings = EngineSettings(
        model=DRAFT,
        speculative=spec(3, 4, 8, algorithm="mtp"),
        memory={"page_size": 4, "max_running_requests": 8},
    )
    with caplog.at_level(logging.WARNING, logger="eagletree.config"):
        resolved = resolve_speculative(settings, DEEPSEEK_V3)
    logged = tuple(
        record.getMessage() for record in caplog.records if record.name == "eagletree.config"
    )
    assert len(resolved.warnings) == 2
    assert logged == resolved.warnings


def test_the_chosen_defaults_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    settings = EngineSettings(model=DRAFT, speculative={"algorithm": "eagle"}, memory=ROOMY)
    with caplog.at_level(logging.INFO, logger="eagletree.config"):
        resolve_speculative(settings, LLAMA)
    assert "speculative parameters chosen for LlamaForCausalLM (the Llama family)" in caplog.text


def test_the_request_limit_default_is_logged_at_info_not_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = EngineSettings(model=DRAFT, speculative=spec(3, 4, 8, algorithm="eagle"))
    with caplog.at_level(logging.INFO, logger="eagletree.config"):
        resolved = resolve_speculative(settings, LLAMA)
    assert resolved.max_running_requests == 48 and resolved.warnings == ()
    levels = {r.levelno for r in caplog.records if MAX_RUNNING_WARNING in r.getMessage()}
    assert levels == {logging.INFO}


def test_the_resolved_value_is_frozen() -> None:
    resolved = resolve_speculative(EngineSettings(), LLAMA)
    assert isinstance(resolved, ResolvedSpeculative)
    assert not resolved.enabled
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.num_steps = 3  # type: ignore[misc]


def test_resolution_is_deterministic_and_leaves_the_settings_alone() -> None:
    settings = EngineSettings(model=DRAFT, speculative=spec(3, 1, 9, algorithm="eagle"))
    before = settings.model_dump()
    first = resolve_speculative(settings, LLAMA)
    assert resolve_speculative(settings, LLAMA) == first
    assert settings.model_dump() == before
