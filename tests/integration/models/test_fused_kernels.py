"""Models with ``fused_kernels=True`` give the logits of the torch reference path (Triton backend).

A tiny Llama target and an EAGLE-1 / EAGLE-3 head or a Llama MTP layer run a ragged prefill,
a chunk and decode steps (and a draft step on its own output) through their runners twice —
once with the Triton kernels (RMSNorm, add + RMSNorm, SiLU-and-mul, RoPE fused with the KV
store) and once with the torch code — over the same weights; so does a tiny DeepSeek MLA
target (the MLA prologue kernel, both RoPE layouts). fp32, so the only differences are the
kernels' summation orders.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagletree.adapters.models.config import LlamaConfig, MLAConfig, RopeConfig
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.domain.model_output import ModelOutput
from tests.conftest import requires_triton
from tests.integration.models.harness import (
    Memory,
    Requests,
    chunked_schedule,
    perturb_parameters,
    relative_error,
)

CONFIG = LlamaConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=10,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=10000.0),
    max_position_embeddings=256,
)
TOLERANCE = 1e-5  # relative to the largest logit, fp32


def build(
    fused: bool, head_kind: str, device: torch.device, folded: bool = False
) -> tuple[LlamaForCausalLM, object]:
    aux = (0, 1, 3) if head_kind == "eagle3" else ()
    target = LlamaForCausalLM(CONFIG, aux, fused_kernels=fused)
    perturb_parameters(target, seed=5)
    if folded:
        target.fold_norms()
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    head: EagleDraft | Eagle3Draft | MTPLayer
    if head_kind == "eagle":
        head = EagleDraft(CONFIG, shared, fc_bias=True, fused_kernels=fused)
    elif head_kind == "mtp":
        head = MTPLayer(CONFIG, shared, fused_kernels=fused)
    else:
        head = Eagle3Draft(CONFIG, shared, 48, CONFIG.hidden_size, fused_kernels=fused)
    perturb_parameters(head, seed=6)
    if folded and isinstance(head, EagleDraft):
        head.fold_norms()
    return target.to(device).eval(), head.to(device).eval()


def run(
    fused: bool, head_kind: str, device: torch.device, folded: bool = False
) -> list[tuple[ModelOutput, ModelOutput]]:
    target, head = build(fused, head_kind, device, folded)
    assert isinstance(head, EagleDraft | Eagle3Draft | MTPLayer)
    memory = Memory(device)
    target_runner = TargetModelRunner(
        target, *memory.runner_parts(target.kv_layout, "triton", torch.float32)
    )
    draft_runner = DraftModelRunner(
        head, *memory.runner_parts(head.kv_layout, "triton", torch.float32)
    )
    target_requests, draft_requests = Requests(memory, 2), Requests(memory, 2)
    outputs = []
    for mode, chunks in chunked_schedule(CONFIG.vocab_size, seed=7)[:4]:
        if mode == "extend":
            batches = target_requests.extend(chunks), draft_requests.extend(chunks)
        else:
            tokens = [c[0] for c in chunks]
            batches = target_requests.decode(tokens), draft_requests.decode(tokens)
        out = target_runner.forward(batches[0])
        hidden = out.aux_hidden_states if head_kind == "eagle3" else out.hidden_states
        assert hidden is not None
        outputs.append((out, draft_runner.forward(batches[1], hidden)))
    # a draft step on the head's own hidden states (H wide), which it must leave unchanged
    own = outputs[-1][1].hidden_states
    before = own.clone()
    step = draft_runner.forward(draft_requests.decode([1, 2]), own)
    assert torch.equal(own, before)
    outputs.append((outputs[-1][0], step))
    return outputs


@pytest.mark.parametrize("folded", [False, True], ids=["norms", "norms-folded"])
@pytest.mark.parametrize("head_kind", ["eagle", "eagle3", "mtp"])
def test_fused_kernels_give_the_logits_of_the_torch_path(
    device: torch.device, head_kind: str, folded: bool
) -> None:
    """Folded, the Llama layers of up to 64 rows run on the residual stream (the norms'
    weights inside q/k/v and gate/up, their statistics applied by the RoPE and SiLU kernels,
    the residual added by o_proj's and down_proj's); the reference keeps its norms."""
    requires_triton(device)
    fused = run(True, head_kind, device, folded)
    reference = run(False, head_kind, device)
    for (target, draft), (ref_target, ref_draft) in zip(fused, reference, strict=True):
        assert relative_error(target.logits, ref_target.logits) < TOLERANCE
        assert relative_error(target.hidden_states, ref_target.hidden_states) < TOLERANCE
        if head_kind == "eagle3":
            aux, ref_aux = target.aux_hidden_states, ref_target.aux_hidden_states
            assert aux is not None and ref_aux is not None
            assert relative_error(aux, ref_aux) < TOLERANCE
        finite = torch.isfinite(ref_draft.logits)
        assert torch.equal(torch.isfinite(draft.logits), finite)
        assert relative_error(draft.logits[finite], ref_draft.logits[finite]) < TOLERANCE
        assert relative_error(draft.hidden_states, ref_draft.hidden_states) < TOLERANCE


MLA = MLAConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=3,
    q_lora_rank=24,
    kv_lora_rank=20,
    qk_nope_head_dim=8,
    qk_rope_head_dim=6,
    v_head_dim=10,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=10000.0),
    max_position_embeddings=256,
)


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "half-split"])
def test_an_mla_target_with_fused_kernels_gives_the_logits_of_the_torch_path(
    device: torch.device, interleave: bool
) -> None:
    requires_triton(device)
    config = dataclasses.replace(MLA, rope_interleave=interleave)
    logits = []
    for fused in (True, False):
        model = DeepseekMLAForCausalLM(config, fused_kernels=fused)
        perturb_parameters(model, seed=8)
        model = model.to(device).eval()
        memory = Memory(device)
        runner = TargetModelRunner(
            model, *memory.runner_parts(model.kv_layout, "triton", torch.float32)
        )
        requests = Requests(memory, 2)
        steps = []
        for mode, chunks in chunked_schedule(config.vocab_size, seed=9)[:4]:
            batch = (
                requests.extend(chunks)
                if mode == "extend"
                else requests.decode([c[0] for c in chunks])
            )
            steps.append(runner.forward(batch).logits)
        logits.append(steps)
    for fused_step, reference_step in zip(*logits, strict=True):
        assert relative_error(fused_step, reference_step) < TOLERANCE
