"""App: an EAGLE-3 draft vocabulary chosen from token frequencies, and its d2t / t2d maps.

Published layout (SpecForge, SafeAILab): the draft vocabulary is a sorted list of target ids;
``d2t[i] = target_id[i] - i`` (int64 offsets, so that ``target = draft + d2t[draft]``) and
``t2d`` is a bool mask over the target vocabulary, true at the chosen ids.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VocabMap(NamedTuple):
    d2t: torch.Tensor  # (draft_vocab,) int64 offsets
    t2d: torch.Tensor  # (vocab,) bool

    @property
    def target_ids(self) -> torch.Tensor:
        """(draft_vocab,) int64: the target id of each draft id."""
        return torch.arange(self.d2t.numel(), dtype=torch.int64) + self.d2t


def frequency_ranked(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids, most frequent first (an EAGLE token map's order).

    ``counts`` (vocab,) token frequencies; ties and unseen ids are ordered by id, so the choice
    is deterministic and fills ``size`` even when fewer tokens were seen.
    """
    vocab = counts.numel()
    if not 0 < size <= vocab:
        raise ValueError(f"vocabulary size {size} is outside 1..{vocab}")
    # stable sort by descending count: equal counts keep ascending id order
    order = torch.sort(counts.to(torch.float64), descending=True, stable=True).indices
    return order[:size].to(torch.int64)


def choose_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids (``frequency_ranked``), sorted
    ascending as an EAGLE-3 draft vocabulary is."""
    return frequency_ranked(counts, draft_vocab_size).sort().values


def vocab_map(target_ids: torch.Tensor, vocab_size: int) -> VocabMap:
    """d2t / t2d of a sorted, duplicate-free list of target ids."""
    ids = target_ids.to(torch.int64).cpu()
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("draft vocabulary ids must be strictly increasing")
    if ids.numel() and not 0 <= int(ids[0]) <= int(ids[-1]) < vocab_size:
        raise ValueError(f"draft vocabulary ids must lie in 0..{vocab_size - 1}")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return VocabMap(ids - torch.arange(ids.numel(), dtype=torch.int64), t2d)


def token_counts(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(vocab,) int64 frequencies of the ids in ``tokens`` (any shape)."""
    return torch.bincount(tokens.reshape(-1).cpu(), minlength=vocab_size)[:vocab_size]
