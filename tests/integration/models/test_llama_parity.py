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
    perturb_parameters,
    random_prompts,
    relative_error,
    skip_unless_backend_runs,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TOLERANCE = 1e-4  # max |diff| relative to the largest reference logit


def tiny_llama(tmp_path: Path, tie: bool, rope: dict[str, Any], seed: int) -> Any:
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
        pytest.param("torch", True, DEFAULT_ROPE, id="torch-tied-default-rope"),
    ],
)
def test_prefill_chunked_extend_and_decode_logits_match_transformers(
    tmp_path: Path, device: torch.device, backend: str, tie: bool, rope: dict[str, Any]
) -> None:
    skip_unless_backend_runs(backend, device)
    reference = tiny_llama(tmp_path, tie, rope, seed=1)
    model = load_target(tmp_path, torch.float32, device, aux_layer_ids=(0, 2, 3))
    memory = Memory(device)
    runner = TargetModelRunner(model, *memory.runner_parts(model.kv_layout, backend, torch.float32))

    # ragged prefill, then a chunk on top of a prefix, then token-by-token decode
    prompts = random_prompts(61, [5, 3], seed=2)
    continuation = random_prompts(61, [2 + 3, 1 + 3], seed=3)
    schedule = [
        ("extend", [prompts[0], prompts[1]]),
        ("extend", [continuation[0][:2], continuation[1][:1]]),
        *[("decode", [[continuation[0][2 + i]], [continuation[1][1 + i]]]) for i in range(3)],
    ]
    requests = Requests(memory, 2)
    sequences: list[list[int]] = [[], []]
    for mode, chunks in schedule:
        starts = [len(s) for s in sequences]
        batch = (
            requests.extend(chunks) if mode == "extend" else requests.decode([c[0] for c in chunks])
        )
        out = runner.forward(batch)
        row = 0
        for i, chunk in enumerate(chunks):
            sequences[i] += chunk
            with torch.no_grad():
                ids = torch.tensor([sequences[i]])
                hf = reference(ids, output_hidden_states=True)
            new = slice(starts[i], starts[i] + len(chunk))
            rows = slice(row, row + len(chunk))
            assert relative_error(out.logits[rows], hf.logits[0, new]) <= TOLERANCE
            # hidden_states are the final-normed lm_head inputs
            assert (
                relative_error(out.hidden_states[rows], hf.hidden_states[-1][0, new]) <= TOLERANCE
            )
            # aux: inputs of layers 0 and 2, then the last layer's output before the final norm
            assert out.aux_hidden_states is not None
            aux = out.aux_hidden_states[rows].view(len(chunk), 3, 64)
            assert relative_error(aux[:, 0], hf.hidden_states[0][0, new]) <= TOLERANCE
            assert relative_error(aux[:, 1], hf.hidden_states[2][0, new]) <= TOLERANCE
            row += len(chunk)
        assert out.logits.dtype == torch.float32
        assert out.logits.shape == (batch.num_tokens, 61)


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
