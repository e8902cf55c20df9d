"""Parity: our DeepSeek MLA target (absorbed attention over the MLA pool) equals transformers'
DeepseekV3ForCausalLM (fp32, dense layers)."""

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
    chunked_schedule,
    perturb_parameters,
    relative_error,
    run_against_reference,
    skip_unless_backend_runs,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TOLERANCE = 1e-4
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,  # scales the softmax by mscale²
}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def tiny_deepseek(
    tmp_path: Path, q_lora_rank: int | None, rope: dict[str, Any], interleave: bool, seed: int
) -> Any:
    config = transformers.DeepseekV3Config(
        vocab_size=61,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=2,  # every layer dense
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=12,  # differs from qk_nope_head_dim so that a swapped split cannot pass
        max_position_embeddings=64,
        rope_parameters=rope,
        rope_interleave=interleave,
    )
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    perturb_parameters(model, seed)
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize(
    ("backend", "q_lora_rank", "rope", "interleave"),
    [
        *[
            pytest.param(b, 24, YARN_ROPE, True, id=f"{b}-q-lora-yarn-interleaved")
            for b in BACKENDS
        ],
        pytest.param("torch", None, DEFAULT_ROPE, False, id="torch-no-q-lora-neox-rope"),
    ],
)
def test_mla_prefill_chunked_extend_and_decode_logits_match_transformers(
    tmp_path: Path,
    device: torch.device,
    backend: str,
    q_lora_rank: int | None,
    rope: dict[str, Any],
    interleave: bool,
) -> None:
    skip_unless_backend_runs(backend, device)
    reference = tiny_deepseek(tmp_path, q_lora_rank, rope, interleave, seed=11)
    model = load_target(tmp_path, torch.float32, device)
    memory = Memory(device)
    runner = TargetModelRunner(model, *memory.runner_parts(model.kv_layout, backend, torch.float32))

    def hf_forward(ids: list[int]) -> Any:
        with torch.no_grad():
            return reference(torch.tensor([ids]), output_hidden_states=True)

    steps = run_against_reference(runner, memory, hf_forward, chunked_schedule(61, 12), TOLERANCE)
    for out, references, ours, theirs in steps:
        for hf, rows, new in zip(references, ours, theirs, strict=True):
            assert (
                relative_error(out.hidden_states[rows], hf.hidden_states[-1][0, new]) <= TOLERANCE
            )
