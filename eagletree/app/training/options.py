"""App: what one `train-draft` run is asked to do — target, data, head, schedule, evaluation —
and EAGLE-3's capture layers named by ``--aux-layers`` (``aux_layer_ids``).

Batch and window default per device (``DEVICE_DEFAULTS``): the GPU defaults are the recipe that
reached 0.75 top-1 agreement at every unrolled step in about two minutes on an H200
(docs/training.md); the CPU ones are small enough to run at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, NamedTuple

from eagletree.adapters.models.stack import check_aux_layer_ids, default_aux_layer_ids
from eagletree.app.training import acceptance_row
from eagletree.app.training.checkpoint import Algorithm
from eagletree.app.training.objective import LossWeights
from eagletree.domain.errors import ConfigurationError


class DeviceDefaults(NamedTuple):
    batch_size: int
    seq_len: int


DEVICE_DEFAULTS = {"cuda": DeviceDefaults(64, 512), "cpu": DeviceDefaults(8, 256)}


def device_defaults(device: str) -> DeviceDefaults:
    """Any non-CUDA device gets the CPU defaults."""
    return DEVICE_DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]


@dataclass(frozen=True, slots=True)
class TrainOptions:
    """``batch_size`` / ``seq_len`` None: the device's default (``resolved``)."""

    target: Path
    algorithm: Algorithm
    data: tuple[Path, ...]
    out: Path
    max_steps: int | None = 1000
    max_minutes: float | None = None
    seed: int = 0
    device: str = "cpu"
    batch_size: int | None = None
    seq_len: int | None = None
    grad_accum: int = 1
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
    grad_clip: float = 0.5
    unroll_steps: int = 4
    loss: LossWeights = field(default_factory=LossWeights)
    num_layers: int = 1
    draft_vocab_size: int | None = None
    aux_layers: str = "standard"
    # EAGLE-3's output norm starts as ones, or as the target's final norm, which the lm_head
    # rows it starts from were trained behind
    eagle3_norm: Literal["ones", "target"] = "ones"
    # EAGLE-3's lm_head (the target's rows of its draft vocabulary at start) trained, or kept
    eagle3_lm_head: Literal["trained", "frozen"] = "trained"
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

    def resolved(self) -> TrainOptions:
        """These options with the device's batch size and window filled in."""
        return replace(self, batch_size=self.batch, seq_len=self.window)

    @property
    def batch(self) -> int:
        """Sequences per micro-batch: the option, else the device's default."""
        default = device_defaults(self.device).batch_size
        return default if self.batch_size is None else self.batch_size

    @property
    def window(self) -> int:
        """Tokens per sequence: the option, else the device's default."""
        return device_defaults(self.device).seq_len if self.seq_len is None else self.seq_len


AUX_LAYER_PRESETS = ("standard", "last")


def aux_layer_ids(spec: str, num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's capture layers from ``--aux-layers``: ``standard`` the inputs of layers 2, L/2
    and L−3 (SafeAILab's and SGLang's), ``last`` those of 2 and L/2 and the last layer's output
    (id L), or comma-separated ids (layer i's input; L the output). A target too shallow for a
    preset gets the nearest layers that exist."""
    if spec in AUX_LAYER_PRESETS:
        standard: tuple[int, ...] = default_aux_layer_ids(num_layers)
        ids = standard if spec == "standard" else (*standard[:2], num_layers)
        return tuple(min(max(i, 0), num_layers) for i in ids)
    try:
        ids = tuple(int(part) for part in spec.split(","))
        return check_aux_layer_ids(ids, num_layers)
    except ValueError as error:
        raise ConfigurationError(
            f"--aux-layers {spec!r}: give {' or '.join(AUX_LAYER_PRESETS)}, or layer ids"
            f" 0..{num_layers} separated by commas ({error})"
        ) from None
