"""App: the draft-training losses — cross-entropy against the target, feature regression.

Every loss is a mean over valid rows: at unrolled step s, row q is valid when q ≥ s (it has a
real prefix) and, for EAGLE-3, when the target's choice lies in the draft vocabulary.

Labels (``--labels``): *hard* is cross-entropy on the target's argmax, what greedy acceptance
asks for; *soft* is cross-entropy against the target's whole distribution, what sampling at
T = 1 asks for; *mixed* is their mean, (hard + soft) / 2, so its scale is either's.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.nn import functional

Labels = Literal["hard", "soft", "mixed"]
LABELS: tuple[Labels, ...] = ("hard", "soft", "mixed")


def valid_rows(seq_len: int, step: int, device: torch.device) -> torch.Tensor:
    """(seq_len,) bool: rows with a real prefix at unrolled step ``step``."""
    return torch.arange(seq_len, device=device) >= step


def soft_cross_entropy(
    logits: torch.Tensor, target_probs: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Mean over ``rows`` of −Σ p·log q; logits, target_probs: (..., V); rows: (...) bool."""
    log_q = functional.log_softmax(logits.float(), dim=-1)
    per_row = -(target_probs * log_q).sum(-1)
    return masked_mean(per_row, rows)


def hard_cross_entropy(
    logits: torch.Tensor, target_ids: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Mean over ``rows`` of −log q(target id); logits: (..., V) in the precision the
    log-softmax runs in (float32 or bfloat16, whose kernel accumulates in float32); target_ids,
    rows: (...). Ids outside the rows may be −1 (a token the draft vocabulary lacks)."""
    per_row = functional.cross_entropy(
        logits.flatten(0, -2), target_ids.clamp_min(0).flatten(), reduction="none"
    )
    return masked_mean(per_row.float().view(target_ids.shape), rows)


Precision = Literal["float32", "bfloat16"]
PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")


def label_loss(
    labels: Labels,
    logits: torch.Tensor,
    target_probs: torch.Tensor | None,
    target_ids: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """The cross-entropy ``labels`` names (module docstring); ``target_probs`` may be None for
    hard labels (it is the batch's largest tensor)."""
    if labels == "hard":
        return hard_cross_entropy(logits, target_ids, rows)
    assert target_probs is not None, f"{labels} labels need the target's distribution"
    if labels == "soft":
        return soft_cross_entropy(logits, target_probs, rows)
    hard = hard_cross_entropy(logits, target_ids, rows)
    return 0.5 * (hard + soft_cross_entropy(logits, target_probs, rows))


def feature_regression(
    predicted: torch.Tensor, target: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Smooth-L1 between the head's output and the target's next feature (EAGLE-1's v-loss)."""
    per_row = functional.smooth_l1_loss(predicted.float(), target.float(), reduction="none")
    return masked_mean(per_row.mean(-1), rows)


def masked_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    weights = rows.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def top1_hits(
    logits: torch.Tensor, target_ids: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, counted) over ``rows``: draft argmax equals ``target_ids``."""
    hits = (logits.argmax(-1) == target_ids) & rows
    return hits.sum(), rows.sum()


def step_weights(num_steps: int, decay: float) -> list[float]:
    """decay^s for s = 0..num_steps−1 (EAGLE-3 uses 0.8)."""
    return [decay**step for step in range(num_steps)]
