"""App: what one `train-draft` run is asked to do — target, data, head, schedule, evaluation —
EAGLE-3's capture layers named by ``--aux-layers`` (``aux_layer_ids``), and which options a run
refuses (``check_options`` before the target loads, ``check_positions`` against its positions).

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


# the options only one algorithm reads ("loss." for LossWeights' fields), and how a refusal
# names each: set for the other algorithm, they are refused rather than ignored
_OWN_OPTIONS: dict[Algorithm, dict[str, str]] = {
    "eagle3": {
        "aux_layers": "--aux-layers chooses EAGLE-3's fused features",
        "eagle3_norm": "eagle3_norm is EAGLE-3's",
        "eagle3_lm_head": "eagle3_lm_head is EAGLE-3's",
        "loss.alignment": "--alignment-weight is EAGLE-3's alignment loss",
    },
    "eagle": {"loss.regression": "--regression-weight is EAGLE-1's feature regression"},
}


def check_positions(options: TrainOptions, positions: int) -> None:
    """Windows and prompts past the target's positions are refused before anything loads (a
    window that long would run out of memory, slowly, rather than fail)."""
    for length, flags in (
        (options.window, "--seq-len"),
        (
            options.prompt_len + options.self_distill_tokens
            if options.self_distill_prompts > 0
            else 0,
            "--prompt-len + --self-distill-tokens",
        ),
        (
            options.prompt_len + options.eval_new_tokens if options.eval_prompts > 0 else 0,
            "--prompt-len + --eval-new-tokens",
        ),
    ):
        if length > positions:
            raise ConfigurationError(
                f"{flags} = {length} exceeds the target's max_position_embeddings "
                f"({positions}): lower {flags.split(' + ')[-1]}"
            )


def _option(options: TrainOptions, path: str) -> object:
    value: object = options
    for name in path.split("."):
        value = getattr(value, name)
    return value


def check_options(options: TrainOptions) -> None:
    """A run's options that can be judged before its target loads: a budget, positive sizes,
    a window of at least a token and its successor, and another algorithm's options left at
    their defaults (``_OWN_OPTIONS``)."""
    if options.max_steps is None and options.max_minutes is None:
        raise ConfigurationError("give --max-steps or --max-minutes (or both)")
    for name in ("unroll_steps", "grad_accum", "batch_size", "num_layers"):
        if getattr(options, name) < 1:
            raise ConfigurationError(f"--{name.replace('_', '-')} must be at least 1")
    if options.window < 2:
        raise ConfigurationError("--seq-len must be at least 2 (a token and its successor)")
    defaults = TrainOptions(options.target, options.algorithm, options.data, options.out)
    for algorithm, own in _OWN_OPTIONS.items():
        if algorithm == options.algorithm:
            continue
        for path, what in own.items():
            if _option(options, path) != _option(defaults, path):
                raise ConfigurationError(f"{what}: drop it for {options.algorithm}")
