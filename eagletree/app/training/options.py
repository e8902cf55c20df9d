"""App: what one `train-draft` run is asked to do — target, data, head, schedule, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagletree.app.training import acceptance_row
from eagletree.app.training.checkpoint import Algorithm
from eagletree.app.training.objective import LossWeights


@dataclass(frozen=True, slots=True)
class TrainOptions:
    target: Path
    algorithm: Algorithm
    data: tuple[Path, ...]
    out: Path
    max_steps: int | None = 1000
    max_minutes: float | None = None
    seed: int = 0
    device: str = "cpu"
    batch_size: int = 8
    seq_len: int = 256
    grad_accum: int = 1
    lr: float = 3e-4
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 0.5
    unroll_steps: int = 3
    loss: LossWeights = field(default_factory=LossWeights)
    num_layers: int = 1
    draft_vocab_size: int | None = None
    held_out_fraction: float = 0.05
    checkpoint_every: int = 0
    resume: bool = False
    self_distill_prompts: int = 0
    self_distill_tokens: int = 0
    prompt_len: int = 32
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    eval_shapes: tuple[acceptance_row.TreeShape, ...] = (acceptance_row.TreeShape.chain(3),)
    log_every: int = 50
