"""Tests of the eagle-family rules: one table row per rule, warning and error texts asserted."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eagletree.config.eagle_hook import (
    DEEPSEEK_FAMILY_PARAMETERS,
    LLAMA_FAMILY_PARAMETERS,
    OTHER_PARAMETERS,
    ResolvedSpeculative,
    max_draft_tokens,
    resolve_speculative,
)
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError

LLAMA = TargetDescription.for_architecture("LlamaForCausalLM")
QWEN2 = TargetDescription.for_architecture("Qwen2ForCausalLM")
DEEPSEEK_V3 = TargetDescription.for_architecture("DeepseekV3ForCausalLM")  # MLA, 1 MTP layer
DEEPSEEK_V32 = TargetDescription.for_architecture("DeepseekV32ForCausalLM")  # DSA, 1 MTP layer
QWEN3_NEXT = TargetDescription.for_architecture("Qwen3NextForCausalLM")  # recurrent, 1 MTP
UNKNOWN_MLA = TargetDescription(architecture="SomeMLAForCausalLM", attention_kind="mla")
MTP3 = TargetDescription(architecture="MiMoForCausalLM", num_mtp_layers=3)

DRAFT = {"target_path": "/ckpt/target", "draft_path": "/ckpt/draft"}
TARGET_ONLY = {"target_path": "/ckpt/target"}
ROOMY = {"max_running_requests": 16}  # set so that the 48 warning shows only where tested

PAGED_REASON = (
    "speculative.eagle_topk = 4 with memory.page_size = 4: the v2 worker compacts the accepted "
    "tree path token by token and needs page_size 1"
)
RECURRENT_REASON = (
    "speculative.eagle_topk = 4 on Qwen3NextForCausalLM, which has recurrent / linear-attention "
    "layers: the v2 worker cannot commit their state from a tree branch"
)
MAX_RUNNING_WARNING = (
    "memory.max_running_requests is unset; speculation uses 48 "
    "(set memory.max_running_requests to change it)"
)


def spec(steps: int | None, topk: int | None, tokens: int | None, **extra: Any) -> dict[str, Any]:
    return {"num_steps": steps, "eagle_topk": topk, "num_draft_tokens": tokens, **extra}


def parameters(values: tuple[int, int, int]) -> dict[str, int]:
    return dict(zip(("num_steps", "topk", "num_draft_tokens"), values, strict=True))


@dataclass(frozen=True)
class Case:
    name: str
    speculative: dict[str, Any]
    model: dict[str, Any] = field(default_factory=lambda: dict(DRAFT))
    memory: dict[str, Any] = field(default_factory=lambda: dict(ROOMY))
    target: TargetDescription = LLAMA
    expect: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    error: str | None = None


RESOLVING = [
    Case(
        "algorithm none disables speculation",
        {},
        model={},
        expect=dict(
            algorithm="none",
            version=None,
            num_steps=0,
            topk=1,
            num_draft_tokens=1,
            draft_path=None,
            worker="none",
        ),
    ),
    Case(
        "algorithm none keeps an explicit request limit",
        {"algorithm": "none"},
        memory={"max_running_requests": 8},
        expect=dict(max_running_requests=8, worker="none"),
    ),
    Case(
        "algorithm none without a request limit uses 48 silently",
        {"algorithm": "none"},
        memory={},
        expect=dict(max_running_requests=48),
    ),
    Case(
        "algorithm none warns about the speculative settings it ignores",
        {"algorithm": "none", "num_steps": 3, "version": "v2"},
        expect=dict(worker="none", version=None),
        warnings=(
            "speculative.algorithm is 'none', so speculative.num_steps, speculative.version is "
            "ignored; set speculative.algorithm to draft",
        ),
    ),
    Case(
        "nextn is an alias of eagle",
        spec(3, 4, 8, algorithm="nextn"),
        expect=dict(algorithm="eagle", version="v2", worker="eagle_v2", draft_path="/ckpt/draft"),
    ),
    Case(
        "eagle3 keeps explicit parameters",
        spec(4, 2, 7, algorithm="eagle3"),
        expect=dict(algorithm="eagle3", num_steps=4, topk=2, num_draft_tokens=7, worker="eagle_v2"),
    ),
    Case(
        "the Llama family defaults to five steps of beam width four",
        {"algorithm": "eagle"},
        expect=parameters(LLAMA_FAMILY_PARAMETERS),
    ),
    Case(
        "the DeepSeek family defaults to a short chain",
        {"algorithm": "eagle"},
        target=DEEPSEEK_V3,
        expect=parameters(DEEPSEEK_FAMILY_PARAMETERS),
    ),
    Case(
        "an MLA target of unknown name counts as the DeepSeek family",
        {"algorithm": "eagle"},
        target=UNKNOWN_MLA,
        expect=parameters(DEEPSEEK_FAMILY_PARAMETERS),
    ),
    Case(
        "other architectures get the conservative default",
        {"algorithm": "eagle"},
        target=QWEN2,
        expect=parameters(OTHER_PARAMETERS),
    ),
    Case(
        "a chain draft forces N to S + 1 and says so",
        spec(3, 1, 8, algorithm="eagle"),
        expect=dict(num_steps=3, topk=1, num_draft_tokens=4, worker="eagle_v2"),
        warnings=(
            "speculative.eagle_topk = 1 drafts a chain, so speculative.num_draft_tokens = 8 "
            "becomes num_steps + 1 = 4",
        ),
    ),
    Case(
        "a chain draft with N = S + 1 passes without a warning",
        spec(6, 1, 7, algorithm="eagle"),
        expect=dict(num_draft_tokens=7),
    ),
    Case(
        "a tree exactly as large as the draft allows is accepted",
        spec(3, 2, 11, algorithm="eagle"),
        expect=dict(num_draft_tokens=11, version="v2"),
    ),
    Case(
        "mtp reads its draft from the target checkpoint",
        spec(3, 1, 4, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=DEEPSEEK_V3,
        expect=dict(algorithm="mtp", draft_path="/ckpt/target", worker="eagle_v2"),
    ),
    Case(
        "mtp with the draft path equal to the target path does not warn",
        spec(3, 1, 4, algorithm="mtp"),
        model={"target_path": "/ckpt/target", "draft_path": "/ckpt/target"},
        target=DEEPSEEK_V3,
        expect=dict(draft_path="/ckpt/target"),
    ),
    Case(
        "mtp with a separate draft path uses it and says so",
        spec(3, 1, 4, algorithm="mtp"),
        target=DEEPSEEK_V3,
        expect=dict(draft_path="/ckpt/draft"),
        warnings=(
            "speculative.algorithm = 'mtp' reads the MTP layers from model.draft_path = "
            "'/ckpt/draft', not from the target checkpoint",
        ),
    ),
    Case(
        "a single MTP layer may draft a tree on v2",
        spec(3, 2, 6, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=DEEPSEEK_V32,
        expect=dict(version="v2", worker="eagle_v2", topk=2),
    ),
    Case(
        "several MTP layers select the multi-layer worker",
        spec(3, 1, 4, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        expect=dict(worker="multi_layer_eagle_v2", version="v2"),
    ),
    Case(
        "multi-layer MTP gets its chain length fixed before its checks",
        spec(2, 1, 5, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        expect=dict(worker="multi_layer_eagle_v2", num_draft_tokens=3),
        warnings=(
            "speculative.eagle_topk = 1 drafts a chain, so speculative.num_draft_tokens = 5 "
            "becomes num_steps + 1 = 3",
        ),
    ),
    Case(
        "a paged tree falls back to v1 with its reason",
        spec(3, 4, 8, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=PAGED_REASON),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({PAGED_REASON}); to run v2 set "
            "memory.page_size = 1 or speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "a paged chain stays on v2",
        spec(3, 1, 4, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v2", fallback_reason=None),
    ),
    Case(
        "a tree on a recurrent target falls back to v1 with its reason",
        spec(3, 4, 8, algorithm="eagle"),
        target=QWEN3_NEXT,
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=RECURRENT_REASON),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({RECURRENT_REASON}); to run v2 set "
            "speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "a chain on a recurrent target stays on v2",
        spec(3, 1, 4, algorithm="eagle"),
        target=QWEN3_NEXT,
        expect=dict(version="v2", worker="eagle_v2"),
    ),
    Case(
        "both fallback reasons are reported together",
        spec(3, 4, 8, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        target=QWEN3_NEXT,
        expect=dict(version="v1", fallback_reason=f"{PAGED_REASON}; {RECURRENT_REASON}"),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({PAGED_REASON}; {RECURRENT_REASON}); "
            "to run v2 set speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "an explicit v1 is honoured without a fallback reason",
        spec(3, 4, 8, algorithm="eagle", version="v1"),
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=None),
    ),
    Case(
        "an explicit v1 on a paged tree is no fallback",
        spec(3, 4, 8, algorithm="eagle", version="v1"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v1", fallback_reason=None),
    ),
    Case(
        "an explicit v2 runs where v2 can",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        expect=dict(version="v2", worker="eagle_v2"),
    ),
    Case(
        "an unset request limit becomes 48, a default like any other: no warning",
        spec(3, 4, 8, algorithm="eagle"),
        memory={},
        expect=dict(max_running_requests=48),
    ),
]

REJECTING = [
    Case(
        "eagle without a draft checkpoint",
        spec(3, 4, 8, algorithm="eagle"),
        model=dict(TARGET_ONLY),
        error="speculative.algorithm = 'eagle' needs a draft checkpoint: set model.draft_path, "
        "or use speculative.algorithm = 'mtp' with a target that has MTP layers, or 'none'",
    ),
    Case(
        "eagle3 without a draft checkpoint",
        spec(3, 4, 8, algorithm="eagle3"),
        model={},
        error="speculative.algorithm = 'eagle3' needs a draft checkpoint",
    ),
    Case(
        "mtp on a target without MTP layers",
        spec(3, 1, 4, algorithm="mtp"),
        error="speculative.algorithm = 'mtp' drafts with the target checkpoint's MTP layers and "
        "LlamaForCausalLM has none: set speculative.algorithm = 'eagle' or 'eagle3' with "
        "model.draft_path, or 'none'",
    ),
    Case(
        "mtp without any checkpoint path",
        spec(3, 1, 4, algorithm="mtp"),
        model={},
        target=DEEPSEEK_V3,
        error="speculative.algorithm = 'mtp' reads its draft layers from the target checkpoint: "
        "set model.target_path",
    ),
    Case(
        "only the number of steps is set",
        {"algorithm": "eagle", "num_steps": 3},
        error="speculative.num_steps, speculative.eagle_topk and speculative.num_draft_tokens "
        "are set together or not at all; speculative.num_steps set but speculative.eagle_topk, "
        "speculative.num_draft_tokens missing: set speculative.eagle_topk and "
        "speculative.num_draft_tokens, or unset speculative.num_steps to let the target "
        "architecture choose",
    ),
    Case(
        "only the number of steps is missing",
        {"algorithm": "eagle", "eagle_topk": 2, "num_draft_tokens": 6},
        error="speculative.eagle_topk, speculative.num_draft_tokens set but speculative.num_steps "
        "missing: set speculative.num_steps, or unset speculative.eagle_topk and "
        "speculative.num_draft_tokens",
    ),
    Case(
        "a tree larger than the draft can fill",
        spec(3, 2, 12, algorithm="eagle"),
        error="speculative.num_draft_tokens = 12 is larger than the tree: num_steps = 3 with "
        "eagle_topk = 2 drafts at most 2 + (3 - 1)·2² = 10 tokens besides the root; set "
        "speculative.num_draft_tokens <= 11 or raise speculative.num_steps or "
        "speculative.eagle_topk",
    ),
    Case(
        "a one-step tree larger than its beam",
        spec(1, 4, 6, algorithm="eagle"),
        error="speculative.num_draft_tokens = 6 is larger than the tree: num_steps = 1 with "
        "eagle_topk = 4 drafts at most 4 + (1 - 1)·4² = 4 tokens besides the root",
    ),
    Case(
        "multi-layer MTP with a tree",
        spec(3, 2, 6, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP (MiMoForCausalLM has 3 MTP layers) drafts a chain: set "
        "speculative.eagle_topk = 1 (now 2) and speculative.num_draft_tokens = num_steps + 1",
    ),
    Case(
        "multi-layer MTP with more steps than layers",
        spec(4, 1, 5, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP runs one MTP layer per draft step and MiMoForCausalLM has 3 MTP "
        "layers: set speculative.num_steps <= 3 (now 4)",
    ),
    Case(
        "multi-layer MTP on v1",
        spec(3, 1, 4, algorithm="mtp", version="v1"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP (MiMoForCausalLM has 3 MTP layers) has only a v2 worker: set "
        "speculative.version = 'auto' or 'v2'",
    ),
    Case(
        "an explicit v2 on a paged tree",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        memory={"page_size": 4},
        error=f"speculative.version = 'v2' cannot run this configuration ({PAGED_REASON}): set "
        "memory.page_size = 1 or speculative.eagle_topk = 1, or speculative.version = 'auto' "
        "to run v1",
    ),
    Case(
        "an explicit v2 tree on a recurrent target",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        target=QWEN3_NEXT,
        error=f"speculative.version = 'v2' cannot run this configuration ({RECURRENT_REASON}): "
        "set speculative.eagle_topk = 1, or speculative.version = 'auto' to run v1",
    ),
]


def settings_of(case: Case) -> EngineSettings:
    return EngineSettings(model=case.model, speculative=case.speculative, memory=case.memory)


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
