"""Parity of DeepSeek-V3 MTP layers, loaded from the published checkpoint layout, with
transformers' own ``MtpModel``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagletree.adapters.models.draft_loading import load_draft
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.runner import DraftModelRunner
from tests.integration.models.draft_parity.references import (
    HIDDEN,
    VOCAB,
    run_draft_against_reference,
)
from tests.integration.models.harness import Memory, perturb_parameters

transformers = pytest.importorskip("transformers")
deepseek_modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
pytestmark = pytest.mark.hf


def test_deepseek_mtp_layers_match_transformers_mtp_model(
    tmp_path: Path, device: torch.device
) -> None:
    modeling_layers = importlib.import_module("transformers.modeling_layers")
    if not hasattr(getattr(modeling_layers, "MtpModel", None), "forward_layer"):
        # transformers 5.17 (the GPU machine's) has an MtpModel without per-layer stepping;
        # CI pins 5.24, where this reference runs
        pytest.skip("this transformers has no MtpModel.forward_layer")
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=4,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=12,
        max_position_embeddings=64,
        num_mtp_layers=2,
    )
    config._attn_implementation = "eager"
    main = transformers.DeepseekV3ForCausalLM(config).eval()
    perturb_parameters(main, seed=41)
    main.save_pretrained(tmp_path / "target")
    mtp = modeling_layers.MtpModel(main, 2).eval()
    for layer in mtp.layers:  # dense MLPs, as the layers we support
        layer.mtp_block.mlp = deepseek_modeling.DeepseekV3MLP(config)
    perturb_parameters(mtp.layers, seed=42)

    # published layout: the MTP layers inside the DeepSeek-V3 checkpoint, after the main layers
    tensors = {}
    for i, layer in enumerate(mtp.layers):
        for name, tensor in layer.state_dict().items():
            name = name.replace("mtp_block.", "").replace("post_norm.", "shared_head.norm.")
            tensors[f"model.layers.{2 + i}.{name}"] = tensor
    shard = tmp_path / "target" / "model-mtp.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard))
    raw = json.loads((tmp_path / "target" / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 2
    (tmp_path / "target" / "config.json").write_text(json.dumps(raw))

    target = load_target(tmp_path / "target", torch.float32, device)
    layers = load_draft(tmp_path / "target", "mtp", target, torch.float32)
    assert len(layers) == 2
    memory = Memory(device)
    for index, head in enumerate(layers):
        runner = DraftModelRunner(
            head, *memory.runner_parts(head.kv_layout, "torch", torch.float32)
        )

        def reference(
            ids: torch.Tensor, hidden: torch.Tensor, index: int = index
        ) -> tuple[torch.Tensor, torch.Tensor]:
            positions = torch.arange(ids.shape[0])[None]
            out = mtp.forward_layer(index, hidden[None], positions, None, input_ids=ids[None])
            return out[0], mtp._project_to_logits(out[0])

        run_draft_against_reference(runner, memory, reference, HIDDEN)
