"""App: a head's behaviour per draft depth on held-out text, teacher-forced.

Two figures, both from the unroll the head is trained with (``heads.unrolled_forward``) over
held-out windows, the target's argmax at row q (the token at q + 2) being the label:

- ``agreement`` per unrolled step: the share of rows (q ≥ s) where the head's top-1 equals the
  target's argmax — EAGLE-3 rows whose argmax lies outside the draft vocabulary count as
  misses, as the engine rejects them;
- the *rank profile*, the contract with the engine's adaptive policy
  (``domain.draft_shape.RankProfile``): ``greedy[d][j]`` is the share of paths accepted through
  depth d whose target argmax at depth d + 1 is the head's (j + 1)-th candidate; ``sampled[d][j]``
  is the mean target probability of that candidate over the same paths, the chance a T = 1
  sample takes it (an approximation: the paths are conditioned on greedy, not sampled,
  acceptance); ``drawn[d][j]`` is the chance that the (j + 1)-th draft drawn from the head
  (without replacement) is the one accepted by rejection sampling at T = 1, the earlier ones
  rejected (a node whose drafts are drawn, ``app.workers.draft_draws``): for j = 0 the mean of
  Σ min(p, q), p and q the target's and the head's distributions; for later draws an unbiased
  one-sample estimate per row (each row draws its earlier drafts from q, seeded).
  A path rooted at row r is accepted through depth d when, for every step s < d, the head's
  top-1 at row r + s equals the target's argmax there *and* the held-out token there equals it
  too, so the unroll's next input is the token the engine would have fed. A depth with fewer
  than ``MIN_ROWS`` such paths falls back to all rows and says so (``conditioned``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from eagletree.app.training.heads import DraftHead, unrolled_forward
from eagletree.domain.draft_shape import fit_under
from eagletree.domain.sampling import sample_from_probs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from eagletree.app.training.target_features import HFTarget

MAX_RANKS = 8  # the engine's prior reads at most 8 ranks per depth
DRAWN_RANKS = 4  # drawn drafts measured per depth (the prior takes the T 1 profile's beyond)
MIN_ROWS = 64  # fewer accepted paths than this at a depth: too noisy, use every row


class DepthProfile(NamedTuple):
    agreement: tuple[float, ...]  # per unrolled step, every row
    greedy: list[list[float]]  # [depth][rank]
    sampled: list[list[float]]
    drawn: list[list[float]]  # [depth][draw]
    conditioned: list[bool]  # per depth: on accepted paths (else every row)
    rows: list[int]  # per depth: rows counted
    coverage: float | None  # EAGLE-3: rows whose target argmax the draft vocabulary holds

    def as_dict(self) -> dict[str, Any]:
        return {
            "agreement_by_step": list(self.agreement),
            "rank_profile": {"greedy": self.greedy, "sampled": self.sampled, "drawn": self.drawn},
            "rank_profile_rows": {"conditioned": self.conditioned, "rows": self.rows},
            "draft_vocab_coverage": self.coverage,
        }


def _shifted(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[..., q − k] at q (False where q < k); x: (batch, rows) bool."""
    if k == 0:
        return x
    return torch.nn.functional.pad(x[:, :-k], (k, 0), value=False)


class RankCounts:
    """Sums over batches of what ``DepthProfile`` reports, per depth."""

    def __init__(self, num_steps: int, num_ranks: int) -> None:
        shape = (num_steps, num_ranks)
        self.num_steps = num_steps
        self.hits = {key: torch.zeros(shape, dtype=torch.float64) for key in ("path", "all")}
        self.probs = {key: torch.zeros(shape, dtype=torch.float64) for key in ("path", "all")}
        drawn_shape = (num_steps, DRAWN_RANKS)
        self.drawn = {key: torch.zeros(drawn_shape, dtype=torch.float64) for key in ("path", "all")}
        self.rows = {key: [0] * num_steps for key in ("path", "all")}
        self.in_vocab = 0

    def add(
        self,
        top_ids: list[torch.Tensor],
        top_probs: list[torch.Tensor],
        choice: torch.Tensor,
        next_tokens: torch.Tensor,
        drawn: list[torch.Tensor] | None = None,
    ) -> None:
        """``top_ids[s]``, ``top_probs[s]``: (batch, rows, ranks) the head's candidates at step s
        (target ids) and the target's probability of each; ``choice``: (batch, rows) the target's
        argmax (the token at q + 2); ``next_tokens``: (batch, rows) the held-out token at q + 2
        (−1 past the window); ``drawn[s]``: (batch, rows, DRAWN_RANKS) each draw's acceptance at
        step s (``drawn_acceptance``; None: 0)."""
        num_rows = choice.shape[1]
        matched = [(ids[..., 0] == choice) & (next_tokens == choice) for ids in top_ids]
        for step in range(self.num_steps):
            valid = (torch.arange(num_rows, device=choice.device) >= step)[None, :]
            path = valid.expand_as(choice)
            for earlier in range(step):
                path = path & _shifted(matched[earlier], step - earlier)
            hits = (top_ids[step] == choice[..., None]).double()
            probs = top_probs[step].double()
            for key, rows in (("path", path), ("all", valid.expand_as(choice))):
                weight = rows[..., None].double()
                self.hits[key][step] += (hits * weight).sum((0, 1)).cpu()
                self.probs[key][step] += (probs * weight).sum((0, 1)).cpu()
                if drawn is not None:
                    self.drawn[key][step] += (drawn[step].double() * weight).sum((0, 1)).cpu()
                self.rows[key][step] += int(rows.sum())  # SYNC: evaluation, once per step

    def profile(self, coverage: float | None) -> DepthProfile:
        greedy, sampled, drawn, conditioned, counted = [], [], [], [], []
        for step in range(self.num_steps):
            key = "path" if self.rows["path"][step] >= MIN_ROWS else "all"
            rows = max(self.rows[key][step], 1)
            greedy.append((self.hits[key][step] / rows).tolist())
            sampled.append((self.probs[key][step] / rows).tolist())
            # one-sample estimates of the later draws may claim more than is left, on few rows
            rates = (self.drawn[key][step] / rows).tolist()
            drawn.append(list(fit_under(rates[:1], rates[1:])))
            conditioned.append(key == "path")
            counted.append(self.rows[key][step])
        agreement = tuple(
            float(self.hits["all"][s, 0]) / max(self.rows["all"][s], 1)
            for s in range(self.num_steps)
        )
        return DepthProfile(agreement, greedy, sampled, drawn, conditioned, counted, coverage)


def teacher_forced(
    head: DraftHead, target: HFTarget, tokens: torch.Tensor, num_steps: int, eagle3: bool
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The head's logits at unrolled steps 0..num_steps−1 over ``tokens`` (batch, T), each
    (batch, T − 1, head V), and the target's logits at q + 1, (batch, T − 1, V)."""
    out = target(tokens)
    ids = tokens.to(target.device)
    features = out.aux if eagle3 else out.hidden
    assert features is not None, "an EAGLE-3 head needs the target's aux states"
    on_cuda = target.device.type == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else nullcontext():
        embeds = target.embed_tokens(ids[:, 1:])
        outputs = unrolled_forward(head, embeds, features[:, :-1], num_steps)
        logits = [head.logits(output).float() for output in outputs]
    return logits, out.logits[:, 1:]


@torch.no_grad()
def depth_profile(
    head: DraftHead,
    target: HFTarget,
    draft_to_target: torch.Tensor | None,
    held: torch.Tensor,
    num_steps: int,
    seq_len: int,
    batch_size: int,
    max_windows: int = 64,
) -> DepthProfile | None:
    """The profile over up to ``max_windows`` held-out windows of ``seq_len`` tokens (one shorter
    window when ``held`` is shorter); None without held-out text. ``draft_to_target``:
    (draft V,) EAGLE-3's draft id → target id, None for EAGLE-1."""
    seq_len = min(seq_len, held.numel())
    if seq_len < num_steps + 2:
        return None
    num_windows = min(max_windows, held.numel() // seq_len)
    windows = held[: num_windows * seq_len].view(num_windows, seq_len)
    eagle3 = draft_to_target is not None
    mapping = None if draft_to_target is None else draft_to_target.to(target.device)
    counts: RankCounts | None = None
    in_vocab, total = 0, 0
    for start in range(0, num_windows, batch_size):
        tokens = windows[start : start + batch_size]
        logits, target_logits = teacher_forced(head, target, tokens, num_steps, eagle3)
        ranks = min(MAX_RANKS, logits[0].shape[-1])
        counts = counts or RankCounts(num_steps, ranks)
        choice = target_logits.argmax(-1)  # (batch, T − 1) target ids
        log_norm = torch.logsumexp(target_logits.float(), dim=-1, keepdim=True)
        ids = tokens.to(target.device)
        next_tokens = torch.nn.functional.pad(ids[:, 2:], (0, 1), value=-1)
        top_ids, top_probs = [], []
        for step_logits in logits:
            top = step_logits.topk(ranks, dim=-1).indices
            top = top if mapping is None else mapping[top]
            top_ids.append(top)
            # the candidates' logits upcast, not the whole (batch, rows, V) tensor each step
            top_probs.append((target_logits.gather(-1, top).float() - log_norm).exp())
        drawn = drawn_acceptance(target_logits, logits, mapping)
        counts.add(top_ids, top_probs, choice, next_tokens, drawn)
        if mapping is not None:
            in_vocab += int(torch.isin(choice, mapping).sum())  # SYNC: evaluation
            total += choice.numel()
    if counts is None:
        return None
    return counts.profile(in_vocab / total if eagle3 and total else None)


def drawn_acceptance(
    target_logits: torch.Tensor,
    head_logits: Sequence[torch.Tensor],
    mapping: torch.Tensor | None,
    ranks: int = DRAWN_RANKS,
    coins: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Each draw's acceptance per row at T = 1 for each unrolled step → per step (batch, rows,
    ``ranks``): ``target_logits`` (batch, rows, V), ``head_logits[s]`` (batch, rows, V_head)
    over the columns ``mapping`` names (None: the target's vocabulary). Draw 0: Σ min(p, q).
    Draw j > 0 is tested only after draws 0..j − 1 were drawn (without replacement) and
    rejected, each rejection leaving the residual max(0, p − q) renormalised: one sampled
    sequence of earlier draws per row gives an unbiased estimate, P(they were rejected) · Σ
    min(p_j, q_j). ``coins`` (batch, rows, ranks − 1) the draws' uniforms (None: seeded 0). One
    window at a time, its target distribution once for every step: a batch's float32
    distributions would take gigabytes."""
    if coins is None:
        generator = torch.Generator(device=target_logits.device).manual_seed(0)
        shape = (*target_logits.shape[:2], ranks - 1)
        coins = torch.rand(shape, generator=generator, device=target_logits.device)
    per_step: list[list[torch.Tensor]] = [[] for _ in head_logits]
    for window, target_row in enumerate(target_logits):  # (rows, V)
        p = torch.softmax(target_row.float(), dim=-1)
        outside = torch.zeros(p.shape[0], device=p.device)
        if mapping is not None:  # the head's columns; q is 0 elsewhere, where p keeps its mass
            p = p[:, mapping]
            outside = (1.0 - p.sum(dim=-1)).clamp(min=0.0)
        for rows, step_logits in zip(per_step, head_logits, strict=True):
            q = torch.softmax(step_logits[window].float(), dim=-1)
            rows.append(_draws_accepted(p, outside, q, coins[window], ranks))
    return [torch.stack(rows) for rows in per_step]


def _draws_accepted(
    p: torch.Tensor, outside: torch.Tensor, q: torch.Tensor, coins: torch.Tensor, ranks: int
) -> torch.Tensor:
    """(rows, ranks): draw j's acceptance for target ``p`` (rows, V_head) with ``outside``
    (rows,) of its mass beyond the head's columns, head ``q`` (rows, V_head)."""
    rates = [torch.minimum(p, q).sum(dim=-1)]
    reached = torch.ones_like(outside)
    for rank in range(1, ranks):
        drawn = sample_from_probs(q, coins[:, rank - 1]).unsqueeze(1)  # (rows, 1)
        q_x, p_x = q.gather(1, drawn).squeeze(1), p.gather(1, drawn).squeeze(1)
        rejected = torch.where(q_x > 0, (1.0 - p_x / q_x.clamp(min=1e-30)).clamp(0.0, 1.0), 0.0)
        reached = reached * rejected
        left = (p - q).clamp(min=0.0)
        total = left.sum(dim=-1) + outside
        kept = (total > 0).unsqueeze(1)
        p = torch.where(kept, left / total.clamp(min=1e-30).unsqueeze(1), 0.0)
        outside = torch.where(kept.squeeze(1), outside / total.clamp(min=1e-30), 0.0)
        q = q.scatter(1, drawn, 0.0)
        mass = q.sum(dim=-1, keepdim=True)
        q = torch.where(mass > 0, q / mass.clamp(min=1e-30), 0.0)
        rates.append(reached * torch.minimum(p, q).sum(dim=-1))
    return torch.stack(rates, dim=-1)
