"""References of the draft heads built from transformers' layers, and the run that
compares a head over its KV pool with one.

EAGLE-1 and EAGLE-3 have no transformers class, so each reference is assembled from HF Llama
modules the way SafeAILab / SpecForge define the head, written to disk in the published format,
and loaded with our loader. Every reference recomputes a request's whole sequence densely; our
runner sees it as a ragged EXTEND followed by DECODE steps through the pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from eagletree.adapters.models.runner import DraftModelRunner
from tests.integration.models.harness import (
    Memory,
    Requests,
    perturb_parameters,
    random_prompts,
    relative_error,
)

transformers = pytest.importorskip("transformers")
llama_modeling = pytest.importorskip("transformers.models.llama.modeling_llama")

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
