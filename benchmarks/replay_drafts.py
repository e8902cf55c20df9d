"""A model of what a draft head's steps accept, for replaying the adaptive policy on the CPU
(``benchmarks/policy_replay.py``): each request's accepted path through a shape's tree, drawn.

A step drafts as EAGLE does: every node's candidates come with the draft's probabilities
(sorted, rank 0 the likeliest), the beam keeps the k best paths by their products, and the
N − 1 best of all drafted candidates are verified. The target takes a node's rank j with
probability ``ease × q_j`` (else none of them), where

- ``q`` is the node's own: its top candidate's probability is ``sigmoid(confidence +
  confidence_spread · z)``, the rest of the mass falling off geometrically by ``tail`` —
  so a step's tree is deep where its nodes are sure and wide where they are not, which is what
  a real tree gains over the static tree of average rates (``draft_shape.expected_accepted``);
- ``ease`` is the step's, shared by all its nodes: ``sigmoid(ease + ease_spread · z)`` times
  the request's own factor (``request_spread``: prompts differ) — a path that went deep was on
  an easy step, so a learned profile's rates rise with depth, as the H200's do. The normal
  draw ``z`` of a request's ease carries over from its step to its next by ``persistence``
  (``ease_noise``: an easy stretch of text lasts some steps), without changing its spread.

Chains are priced exactly by a learned profile whatever these are (its rates are conditional
on the depth reached); trees are not, as on the GPU. ``fit_model`` picks the parameters whose
tokens a step match a bench run's fixed shapes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from eagletree.domain.draft_shape import DraftShape

# the ranks a node's distribution is made over before its k best are drafted
_RANKS = 8


@dataclass(frozen=True, slots=True)
class DraftModel:
    """Logit-space means and spreads of a step's ease and a node's confidence (see above)."""

    ease: float
    ease_spread: float
    confidence: float
    confidence_spread: float
    tail: float = 0.5
    request_spread: float = 0.1
    persistence: float = 0.0

    def request_factors(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """Each of ``count`` requests' factor on its steps' ease (count,)."""
        uniform = torch.rand(count, generator=generator, dtype=torch.float64)
        return 1.0 + self.request_spread * (2.0 * uniform - 1.0)

    def ease_noise(
        self, count: int, generator: torch.Generator, previous: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``count`` requests' standard normal draws of their step's ease (count,): fresh ones,
        or from their last step's ``previous``, ``persistence`` × that plus fresh noise (the
        variance kept 1)."""
        fresh = _normal(count, generator)
        if previous is None:
            return fresh
        rho = self.persistence
        return rho * previous + math.sqrt(1.0 - rho * rho) * fresh

    def paths(
        self,
        shape: DraftShape,
        factors: torch.Tensor,
        generator: torch.Generator,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of ``shape`` for requests of ``factors`` (n,) → ranks (n, S) int64, the rank
        accepted at each depth (−1 from the first depth not accepted), and offered (n, S)
        int64, the candidates verified there under the accepted path (0 where it did not
        reach); ``noise`` (n,): the step's draws of the requests' ease (``ease_noise``;
        None: fresh ones)."""
        n, steps, k = len(factors), shape.num_steps, shape.topk
        z = _normal(n, generator) if noise is None else noise
        ease = torch.sigmoid(self.ease + self.ease_spread * z)
        ease = (ease * factors).clamp(0.0, 1.0)
        beam_scores = torch.ones(n, 1, dtype=torch.float64)
        scores, choices, beams = [], [], []
        for _ in range(steps):
            width = beam_scores.shape[1]
            q = self._node_probabilities(n, width, generator)[..., :k]  # (n, width, k)
            # the target's pick at every beam node: rank j with probability ease · q_j
            coin = torch.rand(n, width, 1, generator=generator, dtype=torch.float64)
            taken = (coin < torch.cumsum(ease[:, None, None] * q, dim=-1)).to(torch.int64)
            choice = torch.where(taken.any(-1), k - taken.sum(-1), -1)  # (n, width)
            children = (beam_scores[..., None] * q).reshape(n, width * k)
            order = torch.argsort(children, dim=1, descending=True, stable=True)
            kept = order[:, :k]  # (n, ≤ k) indices into this depth's children
            scores.append(children)
            choices.append(choice)
            beams.append(kept)
            beam_scores = torch.gather(children, 1, kept)
        drafted = torch.cat(scores, dim=1)  # (n, candidates), depth by depth
        ranked = torch.argsort(drafted, dim=1, descending=True, stable=True)
        verified = torch.zeros_like(drafted, dtype=torch.bool)
        verified.scatter_(1, ranked[:, : shape.num_draft_tokens - 1], True)
        return _walk(verified, choices, beams, k)

    def _node_probabilities(self, n: int, width: int, generator: torch.Generator) -> torch.Tensor:
        """(n, width, _RANKS) each node's candidates' probabilities, descending."""
        top = torch.sigmoid(
            self.confidence + self.confidence_spread * _normal((n, width), generator)
        )
        falloff = (1.0 - self.tail) * self.tail ** torch.arange(_RANKS - 1, dtype=torch.float64)
        q = torch.cat([top[..., None], (1.0 - top)[..., None] * falloff], dim=-1)
        return torch.sort(q, dim=-1, descending=True).values

    def tokens_per_step(
        self, shape: DraftShape, generator: torch.Generator, steps: int = 2048
    ) -> float:
        """Mean tokens one step of ``shape`` commits (1 + accepted drafts), sampled."""
        if shape.is_plain:
            return 1.0
        ranks, _ = self.paths(shape, self.request_factors(steps, generator), generator)
        return 1.0 + float(accepted_drafts(ranks).double().mean())


def accepted_drafts(ranks: torch.Tensor) -> torch.Tensor:
    """(n,) the leading accepted depths of ``ranks`` (n, S)."""
    return torch.cumprod((ranks >= 0).to(torch.int64), dim=1).sum(dim=1)


def _walk(
    verified: torch.Tensor, choices: list[torch.Tensor], beams: list[torch.Tensor], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's path down the verified tree: at each depth the node it stands on offers
    its verified children, and the one the target picks is accepted if verified; the path
    goes on from it if the beam expanded it."""
    n, steps = verified.shape[0], len(choices)
    rows = torch.arange(n)
    position = torch.zeros(n, dtype=torch.int64)  # the node's index in its depth's beam
    alive = torch.ones(n, dtype=torch.bool)
    ranks = torch.full((n, steps), -1, dtype=torch.int64)
    offered = torch.zeros((n, steps), dtype=torch.int64)
    start = 0
    for depth, (choice, kept) in enumerate(zip(choices, beams, strict=True)):
        width = choice.shape[1]
        under = verified[:, start : start + width * k].reshape(n, width, k)[rows, position]
        count = under.sum(dim=1)
        offered[:, depth] = torch.where(alive, count, 0)
        pick = choice[rows, position]
        accepted = alive & (pick >= 0) & under[rows, pick.clamp(min=0)]
        ranks[:, depth] = torch.where(accepted, pick, -1)
        child = position * k + pick.clamp(min=0)
        expanded = kept == child[:, None]  # (n, ≤ k)
        alive = accepted & expanded.any(dim=1)
        position = expanded.to(torch.int64).argmax(dim=1)
        start += width * k
    return ranks, offered


def _normal(size: int | tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    shape = (size,) if isinstance(size, int) else size
    return torch.randn(shape, generator=generator, dtype=torch.float64)


# the grid ``fit_model`` searches: logit means and spreads of the ease and the confidence
EASE_MEANS = (0.0, 0.75, 1.5, 2.25, 3.0, 4.0, 5.0, 6.0)
EASE_SPREADS = (0.5, 1.5, 3.0)
CONFIDENCE_MEANS = (0.5, 1.5, 2.5, 3.5, 5.0, 6.5)
CONFIDENCE_SPREADS = (0.5, 1.5, 3.0, 4.5)
TAILS = (0.3, 0.6, 0.85)


def fit_model(
    measured: Mapping[DraftShape, float], *, seed: int = 0, steps: int = 512
) -> DraftModel:
    """The model whose sampled tokens a step are nearest ``measured`` (per drafting shape, by
    squared log ratio): the grid's best, then refined one parameter at a time by steps that
    halve (``_refined``)."""
    shapes = [shape for shape in measured if not shape.is_plain]
    if not shapes:
        raise ValueError("fitting a draft model needs a drafting shape's tokens a step")

    def error(model: DraftModel) -> float:
        total = 0.0
        for shape in shapes:
            generator = torch.Generator().manual_seed(seed)  # the same coins for every model
            sampled = model.tokens_per_step(shape, generator, steps)
            total += math.log(sampled / measured[shape]) ** 2
        return total

    grid = itertools.product(EASE_MEANS, EASE_SPREADS, CONFIDENCE_MEANS, CONFIDENCE_SPREADS, TAILS)
    scored = [(error(model), model) for model in (DraftModel(*point) for point in grid)]
    best_error, best = min(scored, key=lambda pair: pair[0])
    return _refined(best, best_error, error)


def _refined(
    model: DraftModel, model_error: float, error: Callable[[DraftModel], float]
) -> DraftModel:
    """Coordinate search from ``model``: each parameter moved by ± its step while that lowers
    ``error``, the steps halved after each round."""
    steps = {"ease": 0.5, "ease_spread": 0.5, "confidence": 0.5, "confidence_spread": 0.5,
             "tail": 0.1}  # fmt: skip
    for _ in range(4):
        for name, step in steps.items():
            for sign in (1.0, -1.0):
                value = getattr(model, name) + sign * step
                if value < 0 or (name == "tail" and value >= 1):
                    continue
                trial = dataclasses.replace(model, **{name: value})
                trial_error = error(trial)
                if trial_error < model_error:
                    model, model_error = trial, trial_error
        steps = {name: step / 2 for name, step in steps.items()}
    return model


def model_table(
    model: DraftModel, shapes: Sequence[DraftShape], *, seed: int = 0
) -> dict[DraftShape, float]:
    """Tokens a step of each of ``shapes`` under ``model`` (for the fit's report)."""
    generator = torch.Generator().manual_seed(seed)
    return {shape: model.tokens_per_step(shape, generator) for shape in shapes}
