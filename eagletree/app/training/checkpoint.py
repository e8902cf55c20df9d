"""App: trained heads written in the formats eagletree (and SGLang) load, and trainer state.

EAGLE-1 heads are SGLang's ``LlamaForCausalLMEagle`` (SafeAILab's tensor names: ``fc``,
``layers.0.*`` without an input norm); EAGLE-3 heads are SpecForge's ``LlamaForCausalLMEagle3``
(``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``) — the layouts
``eagletree init-random`` writes. The directory of a head is ``config.json`` plus
``model.safetensors``; a checkpoint adds ``trainer_state.pt`` (fp32 weights, optimizer,
schedule, step) for ``--resume``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from torch import nn

from eagletree.adapters.models.config import ConfigReader
from eagletree.app.training.head_modules import HeadShape
from eagletree.app.training.vocab import VocabMap

Algorithm = Literal["eagle", "eagle3"]
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"step-(\d+)$")


def head_shape(reader: ConfigReader) -> HeadShape:
    """A Llama decoder layer shaped like the target (DeepSeek targets: plain MHA heads)."""
    hidden = reader.get_int("hidden_size")
    heads = reader.get_int("num_attention_heads")
    llama = reader.architecture() == "LlamaForCausalLM"
    head_dim = reader.optional_int("head_dim") if llama else None
    return HeadShape(
        hidden_size=hidden,
        intermediate_size=reader.get_int("intermediate_size"),
        num_heads=heads,
        num_kv_heads=reader.get_int("num_key_value_heads", heads) if llama else heads,
        head_dim=head_dim or hidden // heads,
        rms_norm_eps=reader.get_float("rms_norm_eps", 1e-6),
        rope_theta=reader.rope().theta,
    )


def draft_config(
    algorithm: Algorithm,
    target: ConfigReader,
    shape: HeadShape,
    dtype: torch.dtype,
    *,
    num_layers: int = 1,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] = (),
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [
            "LlamaForCausalLMEagle" if algorithm == "eagle" else "LlamaForCausalLMEagle3"
        ],
        "model_type": "llama",
        "vocab_size": target.get_int("vocab_size"),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.get_int("max_position_embeddings", 2048),
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": False,
        "bos_token_id": target.raw.get("bos_token_id"),
        "eos_token_id": target.raw.get("eos_token_id"),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if algorithm == "eagle3":
        config["draft_vocab_size"] = draft_vocab_size
        config["target_hidden_size"] = shape.hidden_size
        # SGLang's convention: layer ids whose *output* is captured, i.e. the input of id + 1
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux_layer_ids]
        }
    return config


def save_head(
    out_dir: Path,
    head: nn.Module,
    config: dict[str, Any],
    dtype: torch.dtype,
    vocab: VocabMap | None = None,
) -> None:
    """``config.json`` and ``model.safetensors`` of ``head`` (its own parameters only)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: t.detach().to(device="cpu", dtype=dtype).contiguous()
        for name, t in head.state_dict().items()
    }
    if vocab is not None:
        tensors["d2t"] = vocab.d2t.clone()
        tensors["t2d"] = vocab.t2d.clone()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def step_dir(out_dir: Path, step: int) -> Path:
    return out_dir / "checkpoints" / f"step-{step:06d}"


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint of the highest step under ``out_dir/checkpoints`` that has trainer state."""
    root = out_dir / "checkpoints"
    found = [
        (int(match[1]), path)
        for path in (root.iterdir() if root.is_dir() else ())
        if (match := _STEP_DIR.search(path.name)) and (path / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def save_state(directory: Path, state: dict[str, Any]) -> None:
    """Write ``trainer_state.pt`` atomically (a crash leaves the previous file or none)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / (STATE_FILE + ".partial")
    torch.save(state, partial)
    partial.replace(directory / STATE_FILE)


def load_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(
        directory / STATE_FILE, map_location="cpu", weights_only=True
    )
    return state
