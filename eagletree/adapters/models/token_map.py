"""Adapter: read a token map — the target token ids an EAGLE head proposes from.

FR-Spec publishes frequency-ranked maps as a ``.pt`` file holding one int64 tensor (the
32,768 most frequent token ids of a corpus, say); SGLang reads them with
``--speculative-token-map``. A ``.json`` file holding a list of ids is read too. The ids must be
distinct target token ids; their order is kept: the i-th id names the head's i-th logits column.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from eagletree.domain.errors import ConfigurationError

TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def read_token_map(path: str | Path, vocab_size: int) -> torch.Tensor:
    """(n,) int64 CPU tensor of the file's ids; ConfigurationError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"token map {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix in TORCH_SUFFIXES:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".json":
            loaded = json.loads(path.read_text())
        else:
            raise ConfigurationError(
                f"token map {path}: unknown format {suffix!r}; "
                f"use a {'/'.join(TORCH_SUFFIXES)} tensor or a .json list"
            )
        ids = torch.as_tensor(loaded)
    except (
        OSError,
        ValueError,
        TypeError,
        RuntimeError,
        EOFError,
        pickle.UnpicklingError,
    ) as error:
        raise ConfigurationError(f"token map {path} cannot be read as token ids: {error}") from None
    return checked_token_ids(ids, vocab_size, f"token map {path}")


def checked_token_ids(ids: torch.Tensor, vocab_size: int, what: str) -> torch.Tensor:
    """``ids`` as (n,) int64 when they are n ≥ 1 distinct ids of 0..vocab_size − 1."""
    if ids.dim() != 1 or ids.numel() == 0:
        raise ConfigurationError(f"{what}: expected a non-empty list of ids, got shape {ids.shape}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ConfigurationError(f"{what}: token ids must be integers, got {ids.dtype}")
    ids = ids.to(torch.int64)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ConfigurationError(
            f"{what}: ids {low}..{high} leave the target vocabulary 0..{vocab_size - 1}"
        )
    repeats = ids.numel() - torch.unique(ids).numel()
    if repeats:
        raise ConfigurationError(f"{what}: {repeats} ids repeat")
    return ids
