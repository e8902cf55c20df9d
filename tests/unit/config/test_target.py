"""Tests of the target description the settings are resolved against."""

from __future__ import annotations

import pytest

from eagletree.config.target import TargetDescription, known_architectures


def test_known_architectures_carry_their_attention_kind_and_layers() -> None:
    deepseek = TargetDescription.for_architecture("DeepseekV3ForCausalLM")
    assert (deepseek.attention_kind, deepseek.num_mtp_layers) == ("mla", 1)
    assert TargetDescription.for_architecture("DeepseekV32ForCausalLM").attention_kind == "dsa"
    assert TargetDescription.for_architecture("Qwen3NextForCausalLM").has_recurrent_layers
    assert "LlamaForCausalLM" in known_architectures()


def test_an_unknown_architecture_is_a_plain_mha_model() -> None:
    target = TargetDescription.for_architecture("NovelForCausalLM")
    assert target.architecture == "NovelForCausalLM"
    assert (target.attention_kind, target.has_recurrent_layers, target.num_mtp_layers) == (
        "mha",
        False,
        0,
    )


def test_the_attention_kind_can_be_overridden() -> None:
    target = TargetDescription.for_architecture("LlamaForCausalLM", attention_kind="mla")
    assert target.attention_kind == "mla"
    assert target.architecture == "LlamaForCausalLM"


def test_an_unknown_attention_kind_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="attention_kind = 'gqa': allowed values are 'mha', "):
        TargetDescription(attention_kind="gqa")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["num_layers", "head_dim", "kv_lora_rank"])
def test_pool_dimensions_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} = 0 must be > 0"):
        TargetDescription(**{field: 0})  # type: ignore[arg-type]


def test_negative_mtp_layers_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_mtp_layers = -1"):
        TargetDescription(num_mtp_layers=-1)
