"""The eagle-family rule tables' vocabulary: the targets, checkpoints and limits a
case starts from, the expected fallback reasons, and the Case row itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription

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


def settings_of(case: Case) -> EngineSettings:
    return EngineSettings(model=case.model, speculative=case.speculative, memory=case.memory)
