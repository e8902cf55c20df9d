"""Configuration: what the settings need to know about the target model (architecture, pools)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

AttentionKind = Literal["mha", "mla", "dsa"]

ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)

# Known architectures: (attention kind, recurrent layers, MTP layers). A read checkpoint takes
# the attention kind and recurrent layers from its row, which its config.json does not state as
# such, and everything else from config.json (`describe_checkpoint`, `describe_target`);
# `eagletree config show` assumes the whole row of `--target-arch` when no checkpoint can be read.
_KNOWN_ARCHITECTURES: dict[str, tuple[AttentionKind, bool, int]] = {
    "LlamaForCausalLM": ("mha", False, 0),
    "Qwen2ForCausalLM": ("mha", False, 0),
    "Qwen3ForCausalLM": ("mha", False, 0),
    "DeepseekV2ForCausalLM": ("mla", False, 0),
    "DeepseekV3ForCausalLM": ("mla", False, 1),
    "DeepseekV32ForCausalLM": ("dsa", False, 1),
    "Qwen3NextForCausalLM": ("mha", True, 1),
    "NemotronHForCausalLM": ("mha", True, 0),
    "MiMoForCausalLM": ("mha", False, 1),
}


@dataclass(frozen=True, slots=True)
class TargetDescription:
    """The target model as configuration and the container see it.

    ``num_kv_heads``/``head_dim``/``v_head_dim`` size an MHA pool; ``kv_lora_rank`` and
    ``qk_rope_head_dim`` size MLA and DSA pools. The defaults describe a tiny test model.
    """

    architecture: str = "LlamaForCausalLM"
    attention_kind: AttentionKind = "mha"
    has_recurrent_layers: bool = False
    num_mtp_layers: int = 0
    num_layers: int = 2
    num_kv_heads: int = 2
    head_dim: int = 16
    v_head_dim: int = 16
    kv_lora_rank: int = 32
    qk_rope_head_dim: int = 16
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.attention_kind not in ATTENTION_KINDS:
            raise ValueError(
                f"attention_kind = {self.attention_kind!r}: allowed values are "
                + ", ".join(repr(kind) for kind in ATTENTION_KINDS)
            )
        if self.num_mtp_layers < 0:
            raise ValueError(f"num_mtp_layers = {self.num_mtp_layers} must be >= 0")
        for name in (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "v_head_dim",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} = {getattr(self, name)} must be > 0")

    @classmethod
    def for_architecture(
        cls, architecture: str, attention_kind: AttentionKind | None = None
    ) -> TargetDescription:
        """A tiny description of a named architecture; unknown names are plain MHA models."""
        kind, recurrent, mtp_layers = _KNOWN_ARCHITECTURES.get(architecture, ("mha", False, 0))
        described = cls(
            architecture=architecture,
            attention_kind=kind,
            has_recurrent_layers=recurrent,
            num_mtp_layers=mtp_layers,
        )
        if attention_kind is not None:
            described = replace(described, attention_kind=attention_kind)
        return described


def known_architectures() -> tuple[str, ...]:
    return tuple(_KNOWN_ARCHITECTURES)
