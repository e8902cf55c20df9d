"""Parity: our Llama target over the KV pool equals transformers' LlamaForCausalLM (fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.runner import TargetModelRunner
from tests.integration.models.harness import (
    BACKENDS,
    Memory,
    Requests,
    chunked_schedule,
    perturb_parameters,
    random_prompts,
    relative_error,
    run_against_reference,
    skip_unless_backend_runs,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TOLERANCE = 1e-4  # max |diff| relative to the largest reference logit


def tiny_llama(
    tmp_path: Path, tie: bool, rope: dict[str, Any], seed: int, bias: bool = False
) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=61,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: two q heads per kv head
        head_dim=16,
        max_position_embeddings=128,
        rope_parameters=rope,
        tie_word_embeddings=tie,
        attention_bias=bias,
        mlp_bias=bias,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    perturb_parameters(model, seed)
    model.save_pretrained(tmp_path)
    return model


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # short, so that every frequency band is exercised
}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize(
    ("backend", "tie", "rope"),
    [
        *[pytest.param(b, False, LLAMA3_ROPE, id=f"{b}-untied-llama3-rope") for b in BACKENDS],
        pytest.param("torch", True, DEFAULT_ROPE, id="torch-tied-default-rope-biases"),
    ],
)
def test_prefill_chunked_extend_and_decode_logits_match_transformers(
    tmp_path: Path, device: torch.device, backend: str, tie: bool, rope: dict[str, Any]
) -> None:
    skip_unless_backend_runs(backend, device)
    reference = tiny_llama(tmp_path, tie, rope, seed=1, bias=tie)
    model = load_target(tmp_path, torch.float32, device, aux_layer_ids=(0, 2, 3))
    memory = Memory(device)
    runner = TargetModelRunner(model, *memory.runner_parts(model.kv_layout, backend, torch.float32))

    def hf_forward(ids: list[int]) -> Any:
        with torch.no_grad():
            return reference(torch.tensor([ids]), output_hidden_states=True)

    steps = run_against_reference(runner, memory, hf_forward, chunked_schedule(61, 2), TOLERANCE)
    for out, references, ours, theirs in steps:
        for hf, rows, new in zip(references, ours, theirs, strict=True):
            # hidden_states are the final-normed lm_head inputs
            assert (
                relative_error(out.hidden_states[rows], hf.hidden_states[-1][0, new]) <= TOLERANCE
            )
            # aux: the inputs of layers 0 and 2, then the last layer's output before the final norm
            assert out.aux_hidden_states is not None
            aux = out.aux_hidden_states[rows].view(rows.stop - rows.start, 3, 64)
            assert relative_error(aux[:, 0], hf.hidden_states[0][0, new]) <= TOLERANCE
            assert relative_error(aux[:, 1], hf.hidden_states[2][0, new]) <= TOLERANCE
            assert relative_error(model.norm(aux[:, 2]), out.hidden_states[rows]) <= TOLERANCE


def test_logits_rows_select_the_rows_of_a_full_forward(tmp_path: Path) -> None:
    tiny_llama(tmp_path, tie=False, rope=DEFAULT_ROPE, seed=4)
    model = load_target(tmp_path, torch.float32, "cpu")
    prompts = random_prompts(61, [4, 6], seed=5)
    outputs = []
    for rows in (None, torch.tensor([3, 9])):
        memory = Memory(torch.device("cpu"))
        runner = TargetModelRunner(
            model, *memory.runner_parts(model.kv_layout, "torch", torch.float32)
        )
        outputs.append(runner.forward(Requests(memory, 2).extend(prompts), logits_rows=rows))
    full, last_only = outputs
    # the same rows, up to matmul blocking over 2 rows instead of 10
    torch.testing.assert_close(last_only.logits, full.logits[[3, 9]])
    assert last_only.aux_hidden_states is None
