"""Adapter: the checkpoint check, what a checkpoint's tensors must hold before a model runs them.

Weights are float32, float16 or bfloat16 (float64 is cast down): eagletree reads no quantised
format, and an integer or float8 tensor copied into a float weight would run as different
numbers, not fail. Index tensors (EAGLE-3's ``d2t``/``t2d`` vocabulary maps) are integers or
booleans. Every floating value is finite: NaN or infinite weights decode garbage with a
plausible acceptance length. Shapes are checked against the model config.json describes by
``tensor_files.fill_module`` before anything is read.

The finiteness test runs where the tensor was read (the GPU when loading onto it) and is read
back once per model, not once per tensor. Errors name the file and the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from eagletree.domain.errors import ConfigurationError

WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# tensors that hold ids, not weights (EAGLE-3 heads: draft → target id offsets, target mask)
INDEX_TENSOR_NAMES = frozenset({"d2t", "t2d"})


def holds_indices(name: str) -> bool:
    """Whether checkpoint tensor ``name`` is an index tensor by its format's name."""
    return name.rpartition(".")[2] in INDEX_TENSOR_NAMES


def check_dtype(file: Path, name: str, dtype: torch.dtype, weight: bool) -> None:
    """A weight (``weight``) must be a supported float, an index tensor an integer or bool."""
    if weight and dtype not in WEIGHT_DTYPES:
        raise ConfigurationError(
            f"{file}: tensor {name!r} is {str(dtype).removeprefix('torch.')}, but eagletree "
            "loads weights in float32, float16 or bfloat16 (no quantised format): convert the "
            "checkpoint to one of them"
        )
    if not weight and (dtype.is_floating_point or dtype.is_complex):
        raise ConfigurationError(
            f"{file}: tensor {name!r} is {str(dtype).removeprefix('torch.')}, but it holds "
            "token ids: integers are expected (is this checkpoint of the right format?)"
        )


class CheckpointCheck:
    """Checks the tensors of one model as its loader reads them; ``finish`` reports the first
    tensor with a value that is not finite."""

    def __init__(self) -> None:
        self._finite: list[torch.Tensor] = []  # one 0-d bool per floating tensor, on its device
        self._where: list[tuple[Path, str]] = []

    def tensor(self, file: Path, name: str, tensor: torch.Tensor, weight: bool) -> None:
        """Check ``tensor`` (``name`` of ``file``), which fills a weight when ``weight``."""
        check_dtype(file, name, tensor.dtype, weight)
        if tensor.is_floating_point():
            self._finite.append(torch.isfinite(tensor).all())
            self._where.append((file, name))

    def finish(self) -> None:
        """Raise ConfigurationError naming the first tensor holding NaN or an infinity."""
        if not self._finite:
            return
        finite = torch.stack([flag.to("cpu") for flag in self._finite])  # SYNC: once per model
        if bool(finite.all()):
            return
        file, name = self._where[int((~finite).nonzero()[0, 0])]
        raise ConfigurationError(
            f"{file}: tensor {name!r} holds NaN or infinite values: the checkpoint is corrupt "
            "(or was saved after training diverged); write or download it again"
        )


def check_tensors(tensors: Iterable[tuple[Path, str, torch.Tensor]]) -> None:
    """Check (file, name, tensor) triples of whole checkpoint files, each a weight unless its
    name is an index tensor's (``config validate``'s pass, one tensor in memory at a time)."""
    check = CheckpointCheck()
    for file, name, tensor in tensors:
        check.tensor(file, name, tensor, weight=not holds_indices(name))
    check.finish()
