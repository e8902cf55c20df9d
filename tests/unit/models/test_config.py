"""Model configs parsed from config.json: both rope layouts, and errors that name file and key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagletree.adapters.models.config import (
    ConfigReader,
    RopeConfig,
    parse_llama_config,
    parse_mla_config,
)
from eagletree.domain.errors import ConfigurationError

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def reader(tmp_path: Path, raw: dict[str, Any]) -> ConfigReader:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return ConfigReader.from_dir(tmp_path)


def test_llama_defaults_derive_head_dim_and_plain_rope(tmp_path: Path) -> None:
    config = parse_llama_config(reader(tmp_path, LLAMA))
    assert config.head_dim == 16
    assert config.num_key_value_heads == 2
    assert config.rope == RopeConfig(theta=10000.0, original_max_position_embeddings=1024)
    assert not config.tie_word_embeddings


def test_the_old_rope_scaling_layout_and_the_transformers_5_layout_parse_alike(
    tmp_path: Path,
) -> None:
    scaling = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    old = {**LLAMA, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **scaling}}
    new = {**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rope_old = parse_llama_config(reader(tmp_path / "a", old)).rope
    rope_new = parse_llama_config(reader(tmp_path / "b", new)).rope
    assert rope_old == rope_new
    assert (rope_old.rope_type, rope_old.theta, rope_old.factor) == ("llama3", 500000.0, 8.0)


def test_deepseek_v3_yarn_written_with_type_parses(tmp_path: Path) -> None:
    raw = {
        **LLAMA,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    }
    config = parse_mla_config(reader(tmp_path, raw))
    assert config.q_lora_rank is None
    assert config.qk_head_dim == 24
    assert config.rope.rope_type == "yarn"
    assert (config.rope.factor, config.rope.mscale_all_dim) == (40.0, 1.0)
    assert config.rope_interleave


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vocab_size": None}, r"config\.json: missing required key 'vocab_size'"),
        ({"hidden_size": "64"}, r"config\.json: 'hidden_size' must be an integer, got '64'"),
        ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
        ({"num_key_value_heads": 3}, r"num_attention_heads 4 is not a multiple of kv heads 3"),
        ({"rope_scaling": {"rope_type": "longrope"}}, r"rope type 'longrope' is not supported"),
        ({"tie_word_embeddings": "yes"}, r"'tie_word_embeddings' must be true or false"),
    ],
)
def test_bad_llama_configs_name_the_file_and_the_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    raw = {**LLAMA, **change}
    with pytest.raises(ConfigurationError, match=message):
        parse_llama_config(reader(tmp_path, raw))


def test_a_mixture_of_experts_deepseek_config_is_refused(tmp_path: Path) -> None:
    raw = {
        **LLAMA,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "n_routed_experts": 256,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    with pytest.raises(ConfigurationError, match=r"layers 3\.\.60 are mixture-of-experts"):
        parse_mla_config(reader(tmp_path, raw))


def test_broken_json_and_missing_architectures_are_reported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        ConfigReader.from_dir(tmp_path)
    with pytest.raises(ConfigurationError, match="missing 'architectures'"):
        reader(tmp_path, {"vocab_size": 3}).architecture()
