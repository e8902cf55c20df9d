"""Tests of the small domain value objects: errors, attention layer description, model output,
KV pool geometry."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagletree.domain.attention_layer import AttentionLayer
from eagletree.domain.errors import ConfigurationError, DoubleFree, EagleTreeError, OutOfSlots
from eagletree.domain.kv_geometry import KVGeometry
from eagletree.domain.model_output import ModelOutput


def test_out_of_slots_says_what_was_asked_and_what_is_free() -> None:
    error = OutOfSlots(12, 5, what="request rows")
    assert (error.requested, error.available) == (12, 5)
    assert str(error) == "asked for 12 request rows, 5 free"
    assert str(OutOfSlots(3, 0)) == "asked for 3 KV slots, 0 free"


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (ConfigurationError("bad"), ValueError),
        (OutOfSlots(1, 0), RuntimeError),
        (DoubleFree("slot 3"), RuntimeError),
    ],
)
def test_library_errors_share_one_base_and_keep_their_builtin_kind(
    error: EagleTreeError, builtin: type[Exception]
) -> None:
    assert isinstance(error, EagleTreeError)
    assert isinstance(error, builtin)


def test_gqa_group_is_query_heads_per_kv_head() -> None:
    layer = AttentionLayer(
        layer_id=0, num_q_heads=32, num_kv_heads=8, head_dim=128, v_head_dim=128, scaling=0.1
    )
    assert layer.gqa_group == 4
    assert not layer.is_mla and layer.logit_cap == 0.0
    mla = AttentionLayer(1, 16, 1, 576, 512, 0.04, is_mla=True)
    assert mla.gqa_group == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        layer.layer_id = 2  # type: ignore[misc]


def test_model_output_has_no_aux_hidden_states_unless_captured() -> None:
    out = ModelOutput(logits=torch.zeros(2, 7), hidden_states=torch.zeros(3, 4))
    assert out.aux_hidden_states is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.logits = torch.ones(2, 7)  # type: ignore[misc]


def test_a_kv_geometry_counts_a_page_of_dummy_rows_and_refuses_impossible_pools() -> None:
    geometry = KVGeometry(64, 4, 0, torch.bfloat16, torch.device("cpu"))
    assert geometry.num_rows == 68  # slot 0's page is never allocated
    with pytest.raises(dataclasses.FrozenInstanceError):
        geometry.size = 8  # type: ignore[misc]
    for size, page, layers in [(0, 1, 1), (8, 0, 1), (8, 1, -1)]:
        with pytest.raises(ValueError, match="bad pool shape"):
            KVGeometry(size, page, layers, torch.float32, torch.device("cpu"))
