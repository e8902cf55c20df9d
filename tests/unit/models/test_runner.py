"""Runners: they refuse pools that do not fit their model, and pass idle batches through."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import LlamaConfig, RopeConfig
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.domain.batch import ForwardBatch

CONFIG = LlamaConfig(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=10000.0),
    max_position_embeddings=256,
)


def parts(
    layers: int, kv_heads: int = 2, head_dim: int = 8
) -> tuple[MHAKVPool, TensorReqToTokenPool, TorchAttentionBackend]:
    pool = MHAKVPool(
        32, layers, kv_heads, head_dim, head_dim, torch.float32, "cpu", TorchRowMover()
    )
    table = TensorReqToTokenPool(2, 16, "cpu")
    return pool, table, TorchAttentionBackend(pool, table)


def test_a_pool_that_does_not_fit_the_model_is_refused_naming_each_dimension() -> None:
    model = LlamaForCausalLM(CONFIG)
    with pytest.raises(ValueError, match=r"layer_num = 3 \(the model needs 2\); head_dim = 4"):
        TargetModelRunner(model, *parts(layers=3, head_dim=4))


def test_an_idle_batch_gives_empty_outputs_with_the_right_widths() -> None:
    target = LlamaForCausalLM(CONFIG).eval()
    runner = TargetModelRunner(target, *parts(layers=2))
    out = runner.forward(ForwardBatch.idle())
    assert out.logits.shape == (0, 50)
    assert out.hidden_states.shape == (0, 32)
    head = EagleDraft(CONFIG, SharedTargetModules(target.embed_tokens, target.lm_head), True)
    draft = DraftModelRunner(head, *parts(layers=2))
    out = draft.forward(ForwardBatch.idle(), torch.empty(0, 32))
    assert out.logits.shape == (0, 50)
    assert out.hidden_states.shape == (0, 32)


def test_a_draft_forward_needs_one_hidden_row_per_token() -> None:
    target = LlamaForCausalLM(CONFIG).eval()
    head = EagleDraft(CONFIG, SharedTargetModules(target.embed_tokens, target.lm_head), True)
    draft = DraftModelRunner(head, *parts(layers=2))
    with pytest.raises(ValueError, match="3 hidden rows for 0 tokens"):
        draft.forward(ForwardBatch.idle(), torch.zeros(3, 32))


def test_a_draft_shares_the_target_embedding_and_head_without_owning_them() -> None:
    target = LlamaForCausalLM(CONFIG)
    head = EagleDraft(CONFIG, SharedTargetModules(target.embed_tokens, target.lm_head), True)
    names = set(head.state_dict())
    assert not any(name.startswith(("embed_tokens", "lm_head", "shared")) for name in names)
    assert head.shared.embed_tokens is target.embed_tokens
