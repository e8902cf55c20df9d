"""App: one batch's training objective — the target's forward, the head's unroll, the losses.

Row q of a draft sequence reads the token at q + 1 and the target feature at q, and learns the
target's distribution at q + 1 (the token at q + 2) and, for EAGLE-1, the feature at q + 1 —
the shift-by-one of eagletree's draft extend. Step s of the unroll is weighted decay^s.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.nn import functional

from eagletree.app.training.heads import DraftHead, unrolled_forward
from eagletree.app.training.losses import (
    feature_regression,
    soft_cross_entropy,
    step_weights,
    top1_hits,
    valid_rows,
)
from eagletree.app.training.target_features import HFTarget
from eagletree.app.training.vocab import VocabMap


@dataclass(frozen=True, slots=True)
class LossWeights:
    """EAGLE-1 mixes regression 1.0 with cross-entropy 0.1 (the EAGLE paper); EAGLE-3 has only
    the cross-entropy, weight 1.0. ``cross_entropy`` None: the algorithm's weight."""

    cross_entropy: float | None = None
    regression: float = 1.0
    step_decay: float = 0.8

    def cross_entropy_weight(self, eagle3: bool) -> float:
        if self.cross_entropy is not None:
            return self.cross_entropy
        return 1.0 if eagle3 else 0.1


class BatchResult(NamedTuple):
    loss: torch.Tensor  # () differentiable
    accuracy: tuple[float, ...]  # draft top-1 == target top-1, per unrolled step
    num_tokens: int


class Objective:
    """Computes the loss of ``head`` on token batches; ``vocab`` is set for EAGLE-3 heads."""

    def __init__(
        self,
        head: DraftHead,
        target: HFTarget,
        num_steps: int,
        weights: LossWeights,
        vocab: VocabMap | None,
    ) -> None:
        self.head = head
        self.target = target
        self.num_steps = num_steps
        self.weights = weights
        self.vocab = vocab
        self._draft_ids: torch.Tensor | None = None
        self._target_of_draft: torch.Tensor | None = None
        if vocab is not None:
            device = target.device
            draft_of_target = torch.full((vocab.t2d.numel(),), -1, dtype=torch.int64)
            draft_of_target[vocab.target_ids] = torch.arange(vocab.d2t.numel())
            self._draft_ids = draft_of_target.to(device)  # (V,) draft id or −1
            self._target_of_draft = vocab.target_ids.to(device)  # (draft_V,)

    def _autocast(self) -> AbstractContextManager[object]:
        if self.target.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def __call__(self, tokens: torch.Tensor) -> BatchResult:
        # tokens: (batch, seq_len) int64
        out = self.target(tokens)
        ids = tokens.to(self.target.device)
        is_eagle3 = self.vocab is not None
        features = out.aux if is_eagle3 else out.hidden
        assert features is not None, "an EAGLE-3 head needs the target's aux states"
        next_logits = out.logits[:, 1:]  # (batch, T − 1, V): the target at q + 1
        next_feature = out.hidden[:, 1:]
        choice = next_logits.argmax(-1)
        if is_eagle3:
            assert self._draft_ids is not None and self._target_of_draft is not None
            probs = functional.softmax(next_logits[..., self._target_of_draft], dim=-1)
            choice = self._draft_ids[choice]  # −1 where the draft vocabulary lacks the token
            in_vocab = choice >= 0
        else:
            probs = functional.softmax(next_logits, dim=-1)
            in_vocab = torch.ones_like(choice, dtype=torch.bool)
        seq_len = next_logits.shape[1]
        with self._autocast():
            embeds = self.target.embed_tokens(ids[:, 1:])
            outputs = unrolled_forward(self.head, embeds, features[:, :-1], self.num_steps)
        weights = step_weights(self.num_steps, self.weights.step_decay)
        ce_weight = self.weights.cross_entropy_weight(is_eagle3)
        total = torch.zeros((), device=ids.device)
        accuracy = []
        for step, (output, weight) in enumerate(zip(outputs, weights, strict=True)):
            rows = valid_rows(seq_len, step, ids.device)[None, :] & in_vocab
            with self._autocast():
                logits = self.head.logits(output)
            loss = ce_weight * soft_cross_entropy(logits, probs, rows)
            if not is_eagle3:
                reg = feature_regression(output, next_feature, rows)
                loss = loss + self.weights.regression * reg
            total = total + weight * loss
            correct, counted = top1_hits(logits.detach(), choice, rows)
            # SYNC: per-step accuracy for the progress display, once per batch
            accuracy.append(int(correct) / max(int(counted), 1))
        return BatchResult(total, tuple(accuracy), int(tokens.numel()))
