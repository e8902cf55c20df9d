"""Adapter: typed model configurations parsed from a checkpoint's ``config.json``.

Every parse error is a ``ConfigurationError`` that names the file and the key. Both the
transformers 5 layout (``rope_parameters`` holding ``rope_theta``) and the older one
(``rope_theta`` + ``rope_scaling``, with ``type`` or ``rope_type``) are read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagletree.domain.errors import ConfigurationError

RopeType = Literal["default", "linear", "llama3", "yarn"]
_ROPE_TYPES: tuple[RopeType, ...] = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters; the scaling fields are read only by their ``rope_type``."""

    theta: float
    rope_type: RopeType = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """A Llama-architecture decoder (also the shape of EAGLE and EAGLE-3 draft layers)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """A DeepSeek-V2/V3 decoder with multi-head latent attention and dense SwiGLU MLPs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    num_nextn_predict_layers: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ConfigReader:
    """Typed access to one ``config.json`` with errors that name the file and the key."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    @staticmethod
    def from_dir(path: str | Path) -> ConfigReader:
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ConfigurationError(f"{path}: no config.json (is this a checkpoint directory?)")
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as error:
            raise ConfigurationError(f"{file}: not valid JSON: {error}") from error
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{file}: expected a JSON object at the top level")
        return ConfigReader(raw, str(file))

    def error(self, message: str) -> ConfigurationError:
        return ConfigurationError(f"{self.source}: {message}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def get_int(self, key: str, default: int | None = None) -> int:
        value = self.raw.get(key, default)
        if value is None:
            raise self.error(f"missing required key {key!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{key!r} must be an integer, got {value!r}")
        return value

    def optional_int(self, key: str) -> int | None:
        return None if self.raw.get(key) is None else self.get_int(key)

    def get_float(self, key: str, default: float | None = None) -> float:
        value = self.raw.get(key, default)
        if value is None:
            raise self.error(f"missing required key {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"{key!r} must be a number, got {value!r}")
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"{key!r} must be true or false, got {value!r}")
        return value

    def architectures(self) -> list[str]:
        value = self.raw.get("architectures") or []
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise self.error(f"'architectures' must be a list of names, got {value!r}")
        return value

    def architecture(self) -> str:
        names = self.architectures()
        if not names:
            raise self.error("missing 'architectures' (which model class wrote this checkpoint?)")
        return names[0]

    def rope(self) -> RopeConfig:
        params = self.raw.get("rope_parameters") or self.raw.get("rope_scaling") or {}
        if not isinstance(params, dict):
            raise self.error(f"rope parameters must be an object, got {params!r}")
        theta = params.get("rope_theta", self.raw.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in _ROPE_TYPES:
            raise self.error(
                f"rope type {rope_type!r} is not supported (supported: {', '.join(_ROPE_TYPES)})"
            )
        max_positions = self.get_int("max_position_embeddings", 2048)
        factor = params.get("factor")
        if factor is None and rope_type == "yarn":
            original = params.get("original_max_position_embeddings", max_positions)
            factor = max_positions / original
        return RopeConfig(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(factor if factor is not None else 1.0),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", max_positions)
            ),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=float(params.get("mscale") or 1.0),
            mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
            attention_factor=(
                None if params.get("attention_factor") is None else params["attention_factor"]
            ),
            truncate=bool(params.get("truncate", True)),
        )

    def check_silu(self) -> None:
        act = self.raw.get("hidden_act", "silu")
        if act != "silu":
            raise self.error(f"hidden_act {act!r} is not supported (only 'silu')")


def parse_llama_config(reader: ConfigReader) -> LlamaConfig:
    reader.check_silu()
    hidden = reader.get_int("hidden_size")
    heads = reader.get_int("num_attention_heads")
    head_dim = reader.optional_int("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise reader.error(f"hidden_size {hidden} is not divisible by {heads} heads")
        head_dim = hidden // heads
    kv_heads = reader.get_int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise reader.error(f"num_attention_heads {heads} is not a multiple of kv heads {kv_heads}")
    return LlamaConfig(
        vocab_size=reader.get_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=reader.get_int("intermediate_size"),
        num_hidden_layers=reader.get_int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=reader.get_float("rms_norm_eps", 1e-6),
        rope=reader.rope(),
        max_position_embeddings=reader.get_int("max_position_embeddings", 2048),
        tie_word_embeddings=reader.get_bool("tie_word_embeddings", False),
        attention_bias=reader.get_bool("attention_bias", False),
        mlp_bias=reader.get_bool("mlp_bias", False),
    )


def parse_mla_config(reader: ConfigReader) -> MLAConfig:
    reader.check_silu()
    layers = reader.get_int("num_hidden_layers")
    dense_layers = reader.get_int("first_k_dense_replace", 0)
    if reader.get_int("n_routed_experts", 0) > 0 and dense_layers < layers:
        raise reader.error(
            f"layers {dense_layers}..{layers - 1} are mixture-of-experts layers "
            f"(first_k_dense_replace = {dense_layers}); only dense MLPs are supported"
        )
    nextn = reader.raw.get("num_nextn_predict_layers", reader.raw.get("num_mtp_layers", 0))
    return MLAConfig(
        vocab_size=reader.get_int("vocab_size"),
        hidden_size=reader.get_int("hidden_size"),
        intermediate_size=reader.get_int("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=reader.get_int("num_attention_heads"),
        q_lora_rank=reader.optional_int("q_lora_rank"),
        kv_lora_rank=reader.get_int("kv_lora_rank"),
        qk_nope_head_dim=reader.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=reader.get_int("qk_rope_head_dim"),
        v_head_dim=reader.get_int("v_head_dim"),
        rms_norm_eps=reader.get_float("rms_norm_eps", 1e-6),
        rope=reader.rope(),
        max_position_embeddings=reader.get_int("max_position_embeddings", 2048),
        rope_interleave=reader.get_bool("rope_interleave", True),
        tie_word_embeddings=reader.get_bool("tie_word_embeddings", False),
        attention_bias=reader.get_bool("attention_bias", False),
        num_nextn_predict_layers=int(nextn or 0),
    )
