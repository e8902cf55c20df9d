"""Parity of the draft heads over their KV pools with references built from transformers' layers.

EAGLE-1 and EAGLE-3 have no transformers class, so each reference is assembled from HF Llama
modules the way SafeAILab / SpecForge define the head, written to disk in the published format,
and loaded with our loader; the MTP reference is transformers' own ``MtpModel`` (DeepSeek-V3).
Every reference recomputes a request's whole sequence densely; our runner sees it as a ragged
EXTEND followed by DECODE steps through the pool.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from eagletree.adapters.models.draft_loading import load_draft
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.runner import DraftModelRunner
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
llama_modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
deepseek_modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
pytestmark = pytest.mark.hf

TOLERANCE = 1e-4
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 61, 64, 4, 2, 16
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# reference(token ids, per-position input hidden) -> (output hidden, target-vocab logits)
Reference = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def llama_config(**overrides: Any) -> Any:
    fields: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 128,
        "rope_parameters": LLAMA3_ROPE,
    }
    fields.update(overrides)
    config = transformers.LlamaConfig(**fields)
    config._attn_implementation = "eager"
    return config


def causal_mask(length: int) -> torch.Tensor:
    return torch.full((length, length), float("-inf")).triu(1)[None, None]


def save_draft(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


@pytest.fixture
def llama_target(tmp_path: Path) -> Any:
    model = transformers.LlamaForCausalLM(llama_config(num_hidden_layers=2)).eval()
    perturb_parameters(model, seed=21)
    model.save_pretrained(tmp_path / "target")
    return model


def eagle_reference(tmp_path: Path, target: Any) -> tuple[Path, Reference]:
    """SafeAILab's EAGLE-1: fc(2H -> H, bias) then Llama layers, the first without input norm."""
    config = llama_config(num_hidden_layers=2)
    layers = nn.ModuleList(llama_modeling.LlamaDecoderLayer(config, i) for i in range(2))
    layers[0].input_layernorm = nn.Identity()
    fc = nn.Linear(2 * HIDDEN, HIDDEN, bias=True)
    head = nn.ModuleDict({"fc": fc, "layers": layers}).eval()
    perturb_parameters(head, seed=22)
    rotary = llama_modeling.LlamaRotaryEmbedding(config)
    raw = {**config.to_dict(), "architectures": ["LlamaForCausalLM"], "bias": True}
    path = save_draft(tmp_path / "eagle", raw, dict(head.state_dict()))

    def reference(ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = fc(torch.cat((target.model.embed_tokens(ids), hidden), -1))[None]
        positions = torch.arange(ids.shape[0])[None]
        rope = rotary(h, positions)
        for layer in layers:
            h = layer(h, attention_mask=causal_mask(ids.shape[0]), position_embeddings=rope)
        return h[0], target.lm_head(h[0])

    return path, reference


def eagle3_reference(
    tmp_path: Path, target: Any, draft_vocab: int
) -> tuple[Path, Reference, Callable[[torch.Tensor], torch.Tensor]]:
    """SpecForge's LlamaForCausalLMEagle3: fc(3H -> H), a midlayer attending over
    [input_layernorm(embed); hidden_norm(hidden)] (2H), norm, lm_head over a draft vocabulary."""
    wide = llama_config(hidden_size=2 * HIDDEN)
    config = llama_config()
    attn = llama_modeling.LlamaAttention(wide, layer_idx=0)
    attn.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)  # back to H, as the midlayer
    midlayer = nn.ModuleDict(
        {
            "self_attn": attn,
            "mlp": llama_modeling.LlamaMLP(config),
            "input_layernorm": llama_modeling.LlamaRMSNorm(HIDDEN),
            "hidden_norm": llama_modeling.LlamaRMSNorm(HIDDEN),
            "post_attention_layernorm": llama_modeling.LlamaRMSNorm(HIDDEN),
        }
    )
    head = nn.ModuleDict(
        {
            "fc": nn.Linear(3 * HIDDEN, HIDDEN, bias=False),
            "midlayer": midlayer,
            "norm": llama_modeling.LlamaRMSNorm(HIDDEN),
            "lm_head": nn.Linear(HIDDEN, draft_vocab, bias=False),
        }
    ).eval()
    perturb_parameters(head, seed=23)
    generator = torch.Generator().manual_seed(24)
    target_ids = torch.randperm(VOCAB, generator=generator)[:draft_vocab].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[target_ids] = True
    tensors = {
        **head.state_dict(),
        "d2t": target_ids - torch.arange(draft_vocab),
        "t2d": t2d,
        "embed_tokens.weight": target.model.embed_tokens.weight.detach(),  # ignored: shared
    }
    raw = {
        **config.to_dict(),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": draft_vocab,
    }
    path = save_draft(tmp_path / "eagle3", raw, tensors)
    rotary = llama_modeling.LlamaRotaryEmbedding(config)

    def reference(ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = target.model.embed_tokens(ids)
        x = torch.cat((midlayer["input_layernorm"](embeds), midlayer["hidden_norm"](hidden)), -1)
        rope = rotary(x[None], torch.arange(ids.shape[0])[None])
        attended, _ = attn(x[None], position_embeddings=rope, attention_mask=causal_mask(len(ids)))
        h = hidden + attended[0]
        h = h + midlayer["mlp"](midlayer["post_attention_layernorm"](h))
        logits = torch.full((ids.shape[0], VOCAB), float("-inf"))
        logits[:, target_ids] = head["lm_head"](head["norm"](h))
        return h, logits

    def fuse(aux: torch.Tensor) -> torch.Tensor:
        fused: torch.Tensor = head["fc"](aux)
        return fused

    return path, reference, fuse


def run_draft_against_reference(
    runner: DraftModelRunner,
    memory: Memory,
    reference: Reference,
    hidden_width: int,
    fuse: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Two requests: ragged EXTEND (5 and 3 tokens, hidden of ``hidden_width``), then three
    DECODE steps fed with H-wide hidden states (a draft's own output on later steps).

    ``fuse`` maps wide hidden states to what the reference consumes per position (EAGLE-3's fc).
    """
    generator = torch.Generator().manual_seed(31)
    ids = random_prompts(VOCAB, [8, 6], seed=32)
    requests = Requests(memory, 2)
    seen_ids: list[list[int]] = [[], []]
    seen_hidden: list[list[torch.Tensor]] = [[], []]
    steps = [(5, 3, hidden_width)] + [(1, 1, HIDDEN)] * 3
    for first, second, width in steps:
        chunks = [ids[0][len(seen_ids[0]) :][:first], ids[1][len(seen_ids[1]) :][:second]]
        hidden = torch.randn(first + second, width, generator=generator)
        is_extend = len(seen_ids[0]) == 0
        batch = requests.extend(chunks) if is_extend else requests.decode([c[0] for c in chunks])
        out = runner.forward(batch, hidden.to(memory.device))
        fused = fuse(hidden) if fuse is not None and width != HIDDEN else hidden
        row = 0
        for i, chunk in enumerate(chunks):
            start = len(seen_ids[i])
            seen_ids[i] += chunk
            seen_hidden[i] += list(fused[row : row + len(chunk)])
            with torch.no_grad():
                want_hidden, want_logits = reference(
                    torch.tensor(seen_ids[i]), torch.stack(seen_hidden[i])
                )
            rows, new = slice(row, row + len(chunk)), slice(start, start + len(chunk))
            assert relative_error(out.hidden_states[rows], want_hidden[new]) <= TOLERANCE
            want = want_logits[new]
            if out.token_ids is not None:  # logits over the draft vocabulary, named by token_ids
                columns = out.token_ids.cpu()
                outside = torch.ones(want.shape[-1], dtype=torch.bool)
                outside[columns] = False
                assert not torch.isfinite(want[:, outside]).any()
                want = want[:, columns]
            got = out.logits[rows].cpu()
            assert torch.isfinite(got).all() and torch.isfinite(want).all()
            assert relative_error(got, want) <= TOLERANCE
            row += len(chunk)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle_head_matches_its_transformers_reference(
    tmp_path: Path, device: torch.device, backend: str, llama_target: Any
) -> None:
    skip_unless_backend_runs(backend, device)
    path, reference = eagle_reference(tmp_path, llama_target)
    target = load_target(tmp_path / "target", torch.float32, device)
    (head,) = load_draft(path, "eagle", target, torch.float32)
    memory = Memory(device)
    runner = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, backend, torch.float32))
    run_draft_against_reference(runner, memory, reference, HIDDEN)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle3_head_matches_its_transformers_reference_over_the_target_vocabulary(
    tmp_path: Path, device: torch.device, backend: str, llama_target: Any
) -> None:
    skip_unless_backend_runs(backend, device)
    path, reference, fuse = eagle3_reference(tmp_path, llama_target, draft_vocab=23)
    target = load_target(tmp_path / "target", torch.float32, device)
    (head,) = load_draft(path, "eagle3", target, torch.float32)
    assert isinstance(head, Eagle3Draft)
    memory = Memory(device)
    runner = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, backend, torch.float32))
    run_draft_against_reference(runner, memory, reference, 3 * HIDDEN, fuse)


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
