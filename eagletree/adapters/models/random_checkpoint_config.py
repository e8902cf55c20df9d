"""Adapter: the sizes and HF ``config.json`` files of random checkpoints, target and draft.

Targets are HF-compatible (transformers loads them); drafts use the published layouts: EAGLE as
SafeAILab, EAGLE-3 as SpecForge (``LlamaForCausalLMEagle3``), MTP as an exported NextN
directory. ``random_checkpoint`` writes the tensors next to them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Arch = Literal["llama", "deepseek-mla"]
Draft = Literal["eagle", "eagle3", "mtp"]


@dataclass(frozen=True, slots=True)
class ModelSizes:
    """Dimensions of a random checkpoint; MLA fields are read for ``deepseek-mla`` only."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    llama3_rope: bool = False
    q_lora_rank: int | None = 32
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    draft_vocab_size: int = 256
    num_mtp_layers: int = 1


PRESETS: dict[str, ModelSizes] = {
    "tiny": ModelSizes(),
    "llama3-8b": ModelSizes(  # Llama-3.1-8B dimensions, EAGLE-3 draft vocabulary as published
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        llama3_rope=True,
        draft_vocab_size=32000,
    ),
}


def target_config(arch: Arch, sizes: ModelSizes) -> dict[str, Any]:
    """An HF ``config.json`` for the target."""
    common: dict[str, Any] = {
        "vocab_size": sizes.vocab_size,
        "hidden_size": sizes.hidden_size,
        "intermediate_size": sizes.intermediate_size,
        "num_hidden_layers": sizes.num_layers,
        "num_attention_heads": sizes.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": sizes.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": sizes.rope_theta,
        "tie_word_embeddings": sizes.tie_word_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }
    if arch == "llama":
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_key_value_heads": sizes.num_kv_heads,
            "head_dim": sizes.head_dim,
            **common,
        }
        if sizes.llama3_rope:
            config["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            }
        return config
    dense_layers = sizes.num_layers + sizes.num_mtp_layers
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_key_value_heads": sizes.num_heads,
        "q_lora_rank": sizes.q_lora_rank,
        "kv_lora_rank": sizes.kv_lora_rank,
        "qk_nope_head_dim": sizes.qk_nope_head_dim,
        "qk_rope_head_dim": sizes.qk_rope_head_dim,
        "v_head_dim": sizes.v_head_dim,
        "rope_interleave": True,
        # dense layers only: experts are declared (transformers wants them) but never used
        "first_k_dense_replace": dense_layers,
        "n_routed_experts": 4,
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": sizes.intermediate_size,
        "num_nextn_predict_layers": 0,
        **common,
    }


def draft_config(arch: Arch, draft: Draft, sizes: ModelSizes) -> dict[str, Any]:
    target = target_config(arch, sizes)
    if draft == "mtp":
        name = "LlamaForCausalLMNextN" if arch == "llama" else "DeepseekV3ForCausalLMNextN"
        return {**target, "architectures": [name], "num_hidden_layers": sizes.num_mtp_layers}
    # EAGLE heads are Llama layers whatever the target: GQA shaped like a Llama target's
    llama = target_config("llama", sizes)
    llama.update(num_hidden_layers=1, tie_word_embeddings=False)
    if draft == "eagle":
        return {**llama, "architectures": ["LlamaForCausalLMEagle"]}
    return {
        **llama,
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": sizes.draft_vocab_size,
    }


def sizes_with(base: ModelSizes, **overrides: Any) -> ModelSizes:
    """``base`` with the given fields replaced (None values are ignored)."""
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
