"""Configuration: resolve the eagle family's settings up front; every fallback is explained.

Upstream's hook switches from spec v2 to v1 behind the user's back; here each rule either
completes the settings (with a warning that is logged and kept in ``warnings``) or raises
``ConfigurationError`` saying which setting to change. docs/configuration.md has the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from eagletree.config.settings import EngineSettings
from eagletree.config.shape_policy import draws_drafts
from eagletree.config.target import TargetDescription
from eagletree.domain.draft_shape import max_draft_tokens
from eagletree.domain.errors import ConfigurationError

logger = logging.getLogger("eagletree.config")

Algorithm = Literal["none", "eagle", "eagle3", "mtp"]
Version = Literal["v1", "v2"]
WorkerName = Literal["none", "eagle_v1", "eagle_v2", "multi_layer_eagle_v2"]

DEFAULT_MAX_RUNNING_REQUESTS = 48

# (num_steps, eagle_topk, num_draft_tokens) when all three are unset; upstream's table.
LLAMA_FAMILY_PARAMETERS = (5, 4, 8)
DEEPSEEK_FAMILY_PARAMETERS = (3, 1, 4)
OTHER_PARAMETERS = (3, 1, 4)
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1ModelForCausalLM"})
DEEPSEEK_FAMILY = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"}
)

_PARAMETER_FIELDS = ("num_steps", "eagle_topk", "num_draft_tokens")

_Warn = Callable[[str], None]  # logs a warning and keeps it for ResolvedSpeculative.warnings


@dataclass(frozen=True, slots=True)
class ResolvedSpeculative:
    """Speculative parameters after every rule ran; what the container and workers read.

    Disabled speculation is ``algorithm="none"``, ``version=None`` and the one-token chain
    ``num_steps=0, topk=1, num_draft_tokens=1``.
    """

    algorithm: Algorithm
    version: Version | None
    num_steps: int
    topk: int
    num_draft_tokens: int
    draft_path: str | None
    max_running_requests: int
    fallback_reason: str | None
    warnings: tuple[str, ...]
    worker: WorkerName
    token_map: str | None = None  # the EAGLE head's token-map file, if it proposes from one
    draw_drafts: bool = False  # sampling requests draw their drafts (sampled_drafts)

    @property
    def enabled(self) -> bool:
        return self.algorithm != "none"


def default_parameters(target: TargetDescription) -> tuple[tuple[int, int, int], str]:
    """(num_steps, eagle_topk, num_draft_tokens) chosen for the target and the family's name."""
    if target.architecture in LLAMA_FAMILY:
        return LLAMA_FAMILY_PARAMETERS, "the Llama family"
    if target.architecture in DEEPSEEK_FAMILY or target.attention_kind in ("mla", "dsa"):
        return DEEPSEEK_FAMILY_PARAMETERS, "the DeepSeek/MLA family"
    return OTHER_PARAMETERS, "architectures without a tuned default"


def resolve_speculative(settings: EngineSettings, target: TargetDescription) -> ResolvedSpeculative:
    """Apply the eagle-family rules; raise ConfigurationError naming the setting to change."""
    warnings: list[str] = []

    def warn(message: str) -> None:
        logger.warning(message)
        warnings.append(message)

    spec = settings.speculative
    algorithm: Algorithm = "eagle" if spec.algorithm == "nextn" else spec.algorithm
    max_running_requests = settings.memory.max_running_requests

    if algorithm == "none":
        ignored = [
            f"speculative.{name}"
            for name in (*_PARAMETER_FIELDS, "token_map")
            if getattr(spec, name) is not None
        ]
        if spec.version != "auto":
            ignored.append("speculative.version")
        if spec.sampled_drafts != "auto":
            ignored.append("speculative.sampled_drafts")
        if ignored:
            warn(
                f"speculative.algorithm is 'none', so {', '.join(ignored)} "
                "is ignored; set speculative.algorithm to draft"
            )
        return ResolvedSpeculative(
            algorithm="none",
            version=None,
            num_steps=0,
            topk=1,
            num_draft_tokens=1,
            draft_path=None,
            max_running_requests=max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
            fallback_reason=None,
            warnings=tuple(warnings),
            worker="none",
        )

    draft_path = _draft_path(settings, target, algorithm, warn)
    if spec.token_map is not None and algorithm != "eagle":
        raise ConfigurationError(
            f"speculative.token_map = {spec.token_map!r} restricts an EAGLE head's proposals, "
            f"but speculative.algorithm is {algorithm!r} (an EAGLE-3 head carries its own draft "
            "vocabulary, MTP layers propose from the whole one): unset speculative.token_map"
        )
    num_steps, topk, num_draft_tokens = _parameters(settings, target)

    if topk == 1 and num_draft_tokens != num_steps + 1:
        warn(
            f"speculative.eagle_topk = 1 drafts a chain, so speculative.num_draft_tokens = "
            f"{num_draft_tokens} becomes num_steps + 1 = {num_steps + 1}"
        )
        num_draft_tokens = num_steps + 1
    limit = max_draft_tokens(num_steps, topk)
    if num_draft_tokens > limit:
        raise ConfigurationError(
            f"speculative.num_draft_tokens = {num_draft_tokens} is larger than the tree: "
            f"num_steps = {num_steps} with eagle_topk = {topk} drafts at most "
            f"{topk} + ({num_steps} - 1)·{topk}² = {limit - 1} tokens besides the root; "
            f"set speculative.num_draft_tokens <= {limit} or raise speculative.num_steps "
            "or speculative.eagle_topk"
        )

    multi_layer = algorithm == "mtp" and target.num_mtp_layers > 1
    if multi_layer:
        _check_multi_layer(settings, target, num_steps, topk)

    version, fallback_reason = _version(settings, target, topk, warn)

    if max_running_requests is None:
        # a documented default, as without speculation: said at INFO, not warned every run
        max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.info(
            "memory.max_running_requests is unset; speculation uses %d (set "
            "memory.max_running_requests to change it)",
            DEFAULT_MAX_RUNNING_REQUESTS,
        )

    worker: WorkerName
    if version == "v1":
        worker = "eagle_v1"
    else:
        worker = "multi_layer_eagle_v2" if multi_layer else "eagle_v2"
    return ResolvedSpeculative(
        algorithm=algorithm,
        version=version,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        draft_path=draft_path,
        max_running_requests=max_running_requests,
        fallback_reason=fallback_reason,
        warnings=tuple(warnings),
        worker=worker,
        token_map=spec.token_map,
        draw_drafts=draws_drafts(spec.sampled_drafts, worker),
    )


def _draft_path(
    settings: EngineSettings,
    target: TargetDescription,
    algorithm: Algorithm,
    warn: _Warn,
) -> str:
    model = settings.model
    if algorithm != "mtp":
        if model.draft_path is None:
            raise ConfigurationError(
                f"speculative.algorithm = {algorithm!r} needs a draft checkpoint: set "
                "model.draft_path, or use speculative.algorithm = 'mtp' with a target that "
                "has MTP layers, or 'none'"
            )
        return model.draft_path
    if target.num_mtp_layers == 0:
        raise ConfigurationError(
            f"speculative.algorithm = 'mtp' drafts with the target checkpoint's MTP layers and "
            f"{target.architecture} has none: set speculative.algorithm = 'eagle' or 'eagle3' "
            "with model.draft_path, or 'none'"
        )
    if model.draft_path is None:
        if model.target_path is None:
            raise ConfigurationError(
                "speculative.algorithm = 'mtp' reads its draft layers from the target "
                "checkpoint: set model.target_path"
            )
        return model.target_path
    if model.draft_path != model.target_path:
        warn(
            f"speculative.algorithm = 'mtp' reads the MTP layers from model.draft_path = "
            f"{model.draft_path!r}, not from the target checkpoint"
        )
    return model.draft_path


def _parameters(settings: EngineSettings, target: TargetDescription) -> tuple[int, int, int]:
    spec = settings.speculative
    values = (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens)
    steps, topk, tokens = values
    if steps is not None and topk is not None and tokens is not None:
        return steps, topk, tokens
    named = list(zip(_PARAMETER_FIELDS, values, strict=True))
    given = [f"speculative.{name}" for name, value in named if value is not None]
    missing = [f"speculative.{name}" for name, value in named if value is None]
    if given:
        raise ConfigurationError(
            "speculative.num_steps, speculative.eagle_topk and speculative.num_draft_tokens are "
            f"set together or not at all; {', '.join(given)} set but {', '.join(missing)} "
            f"missing: set {' and '.join(missing)}, or unset {' and '.join(given)} to let the "
            "target architecture choose"
        )
    chosen, family = default_parameters(target)
    logger.info(
        "speculative parameters chosen for %s (%s): num_steps=%d, eagle_topk=%d, "
        "num_draft_tokens=%d",
        target.architecture,
        family,
        *chosen,
    )
    return chosen


def _check_multi_layer(
    settings: EngineSettings, target: TargetDescription, num_steps: int, topk: int
) -> None:
    layers = f"{target.architecture} has {target.num_mtp_layers} MTP layers"
    if topk != 1:
        raise ConfigurationError(
            f"multi-layer MTP ({layers}) drafts a chain: set speculative.eagle_topk = 1 "
            f"(now {topk}) and speculative.num_draft_tokens = num_steps + 1"
        )
    if num_steps > target.num_mtp_layers:
        raise ConfigurationError(
            f"multi-layer MTP runs one MTP layer per draft step and {layers}: set "
            f"speculative.num_steps <= {target.num_mtp_layers} (now {num_steps})"
        )
    if settings.speculative.version == "v1":
        raise ConfigurationError(
            f"multi-layer MTP ({layers}) has only a v2 worker: set speculative.version = "
            "'auto' or 'v2'"
        )


def _version(
    settings: EngineSettings, target: TargetDescription, topk: int, warn: _Warn
) -> tuple[Version, str | None]:
    requested = settings.speculative.version
    if requested == "v1":
        return "v1", None
    page_size = settings.memory.page_size
    paged = topk > 1 and page_size > 1
    recurrent = topk > 1 and target.has_recurrent_layers
    if not (paged or recurrent):
        return "v2", None
    reasons: list[str] = []
    if paged:
        reasons.append(
            f"speculative.eagle_topk = {topk} with memory.page_size = {page_size}: the v2 "
            "worker compacts the accepted tree path token by token and needs page_size 1"
        )
    if recurrent:
        reasons.append(
            f"speculative.eagle_topk = {topk} on {target.architecture}, which has recurrent / "
            "linear-attention layers: the v2 worker cannot commit their state from a tree branch"
        )
    reason = "; ".join(reasons)
    # A chain (topk 1) always runs on v2; page_size 1 is enough only without recurrent layers.
    changes = ["speculative.eagle_topk = 1"] if recurrent else ["memory.page_size = 1"]
    if not recurrent:
        changes.append("speculative.eagle_topk = 1")
    if requested == "v2":
        raise ConfigurationError(
            f"speculative.version = 'v2' cannot run this configuration ({reason}): set "
            f"{' or '.join(changes)}, or speculative.version = 'auto' to run v1"
        )
    warn(
        f"speculative.version 'auto' falls back to v1 ({reason}); to run v2 set "
        f"{' or '.join(changes)}"
    )
    return "v1", reason
