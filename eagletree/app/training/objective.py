"""App: one batch's training objective — the target's forward, the head's unroll, the losses.

Row q of a draft sequence reads the token at q + 1 and the target feature at q, and learns the
target's distribution at q + 1 (the token at q + 2) and, for EAGLE-1, the feature at q + 1 —
the shift-by-one of eagletree's draft extend. Step s of the unroll is weighted decay^s.

EAGLE-3 rows whose target top-1 lies outside the draft vocabulary train nothing, with any
labels: the draft cannot propose that token, so the engine rejects its proposal there whatever
it learns, and a soft target renormalised over the draft vocabulary would teach a ranking no
accepted path uses. The share of such rows caps the head's agreement; the held-out evaluation
reports it (``draft_vocab_coverage``) and counts those rows as misses.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.nn import functional

from eagletree.app.training.heads import DraftHead, Eagle3Head, unrolled_forward
from eagletree.app.training.losses import (
    Labels,
    Precision,
    feature_regression,
    label_loss,
    step_weights,
    top1_hits,
    valid_rows,
)
from eagletree.app.training.target_features import HFTarget
from eagletree.app.training.vocab import VocabMap


@dataclass(frozen=True, slots=True)
class LossWeights:
    """Cross-entropy 1.0 on hard labels, plus for EAGLE-1 0.2 × the feature regression: the
    recipe that beat the EAGLE paper's regression 1.0 + soft cross-entropy 0.1 within a short
    budget on an H200 (docs/training.md). EAGLE-3 has no regression: its output is not in the
    target's feature space (its own norm and lm_head read it). ``alignment`` (EAGLE-3 only)
    regresses each step's output at q onto what step 0 reads at q + 1, the fused target states
    ``fc(aux(q + 1))`` (detached): the next step's input, held near the one it was trained on
    at step 0, as EAGLE-1's regression holds its output near the target's feature. Off by
    default: on the real pair it flattened EAGLE-3's agreement by lowering the first steps, and
    cost the greedy chains 2–4 % (docs/training.md)."""

    cross_entropy: float = 1.0
    regression: float = 0.2
    alignment: float = 0.0
    step_decay: float = 0.8
    labels: Labels = "hard"
    # hard labels' log-softmax in the head's compute dtype (bfloat16 under CUDA's autocast,
    # accumulating in float32: the logits are bfloat16 products already, and the gradient
    # reaches the lm_head's product in bfloat16 either way), or over the logits upcast to
    # float32, which reads and writes (rows × vocab) float32 tensors several times: an H200
    # step of the real pair's EAGLE-3 head took 128 ms that way and 112 ms this way. On the
    # CPU the head computes in float32 either way.
    ce_precision: Precision = "bfloat16"


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
        choice = next_logits.argmax(-1)  # the first maximum, in any dtype the logits come in
        if is_eagle3:
            assert self._draft_ids is not None and self._target_of_draft is not None
            choice = self._draft_ids[choice]  # −1 where the draft vocabulary lacks the token
            in_vocab = choice >= 0
        else:
            in_vocab = torch.ones_like(choice, dtype=torch.bool)
        # (batch, T − 1, draft V) float32: over the draft vocabulary, renormalised; hard labels
        # skip it (at 64 × 511 rows of 16k tokens, the gather and the upcast are 2 GB each)
        probs = None
        if self.weights.labels != "hard":
            draft_logits = next_logits
            if is_eagle3:
                assert self._target_of_draft is not None
                draft_logits = next_logits[..., self._target_of_draft]
            probs = functional.softmax(draft_logits.float(), dim=-1)
        seq_len = next_logits.shape[1]
        with self._autocast():
            embeds = self.target.embed_tokens(ids[:, 1:])
            outputs = unrolled_forward(self.head, embeds, features[:, :-1], self.num_steps)
            aligned_to = None
            if is_eagle3 and self.weights.alignment > 0:
                assert isinstance(self.head, Eagle3Head)
                with torch.no_grad():  # (batch, T − 1, H): step 0's input at q + 1
                    aligned_to = self.head.fused_input(features[:, 1:])
        weights = step_weights(self.num_steps, self.weights.step_decay)
        ce_weight = self.weights.cross_entropy
        total = torch.zeros((), device=ids.device)
        accuracy = []
        for step, (output, weight) in enumerate(zip(outputs, weights, strict=True)):
            rows = valid_rows(seq_len, step, ids.device)[None, :] & in_vocab
            with self._autocast():
                logits = self.head.logits(output)
            if self.weights.ce_precision == "float32" or self.weights.labels != "hard":
                logits = logits.float()
            loss = ce_weight * label_loss(self.weights.labels, logits, probs, choice, rows)
            if not is_eagle3:
                reg = feature_regression(output, next_feature, rows)
                loss = loss + self.weights.regression * reg
            elif aligned_to is not None:
                reg = feature_regression(output, aligned_to, rows)
                loss = loss + self.weights.alignment * reg
            total = total + weight * loss
            correct, counted = top1_hits(logits.detach(), choice, rows)
            # SYNC: per-step accuracy for the progress display, once per batch
            accuracy.append(int(correct) / max(int(counted), 1))
        return BatchResult(total, tuple(accuracy), int(tokens.numel()))
