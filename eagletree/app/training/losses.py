"""App: the draft-training losses — soft cross-entropy against the target, feature regression.

Every loss is a mean over valid rows: at unrolled step s, row q is valid when q ≥ s (it has a
real prefix) and, for EAGLE-3, when the target's choice lies in the draft vocabulary.
"""

from __future__ import annotations

import torch
from torch.nn import functional


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
