"""App: a small Llama target trained from scratch with transformers, for tests and benchmarks.

No model can be downloaded here, so a real target/draft pair starts with a target trained on
local text. It is saved with ``save_pretrained`` (the HF format eagletree loads).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn
from torch.nn import functional

from eagletree.app.training.data import WindowSampler
from eagletree.app.training.progress import ProgressLine


@dataclass(frozen=True, slots=True)
class TargetSpec:
    vocab_size: int
    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def hf_config(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }


@dataclass(frozen=True, slots=True)
class TargetTraining:
    max_steps: int | None = 200
    max_minutes: float | None = None
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0
    log_every: int = 50


def train_target(
    spec: TargetSpec,
    tokens: torch.Tensor,
    out_dir: Path,
    training: TargetTraining,
    device: str = "cpu",
    stream: TextIO | None = None,
) -> list[float]:
    """Train on windows of ``tokens`` (bf16 autocast on CUDA), save to ``out_dir``; the losses."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(training.seed)
    model: Any = LlamaForCausalLM(LlamaConfig(**spec.hf_config()))
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.lr, betas=(0.9, 0.95))
    sampler = WindowSampler(tokens, training.seq_len, training.batch_size, training.seed)
    progress = ProgressLine(training.max_steps, stream, every=training.log_every)
    cuda = torch.device(device).type == "cuda"
    losses: list[float] = []
    started = time.perf_counter()
    step = 0
    while True:
        elapsed = time.perf_counter() - started
        if training.max_steps is not None and step >= training.max_steps:
            break
        if training.max_minutes is not None and elapsed >= 60 * training.max_minutes:
            break
        fraction = max(
            step / training.max_steps if training.max_steps else 0.0,
            elapsed / (60 * training.max_minutes) if training.max_minutes else 0.0,
        )
        lr = training.lr * min(1.0, (step + 1) / training.warmup_steps)
        lr *= 0.1 + 0.45 * (1 + math.cos(math.pi * min(fraction, 1.0)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sampler.batch(step).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=batch).logits
        loss = functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, spec.vocab_size), batch[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        # SYNC: the loss for the display
        losses.append(float(loss.detach()))
        progress.update(step, losses[-1], (), batch.numel())
    progress.close()
    model.save_pretrained(str(out_dir))
    return losses


def num_parameters(target_dir: Path) -> int:
    from safetensors import safe_open

    count = 0
    for file in target_dir.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                count += _numel(handle, name)
    return count


def _numel(handle: Any, name: str) -> int:
    shape = handle.get_slice(name).get_shape()
    size = 1
    for dim in shape:
        size *= int(dim)
    return size


@torch.no_grad()
def held_out_quality(
    target_dir: Path, tokens: torch.Tensor, seq_len: int, device: str
) -> tuple[float, float]:
    """Mean next-token cross-entropy and top-1 accuracy of the target on up to 32 held-out
    windows."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model = model.to(device).eval()
    windows = tokens[: (tokens.numel() // seq_len) * seq_len].view(-1, seq_len)[:32].to(device)
    if windows.numel() == 0:
        return float("nan"), float("nan")
    logits = model(input_ids=windows).logits.float()[:, :-1]
    labels = windows[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    )
    top1 = (logits.argmax(-1) == labels).float().mean()
    return float(loss), float(top1)
