"""The drafts of a chain that draws them: each from the draft's distribution at its request's
sampling (temperature, top-k, top-p; a greedy request's argmax), with the step's coins, and what
each was drawn from kept for its verification by speculative sampling
(``domain.chain_sampling``: a depth is then accepted with probability 1 − TV(p, q) rather than
the target's probability of the draft's argmax, which at temperature 1 is far less).

A step of a drawing chain takes 2·S + 1 coins per sampling request: S draws, S acceptance coins
and the bonus's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.domain.chain_sampling import verify_chain_sampled
from eagletree.domain.sampling import sample_from_probs

if TYPE_CHECKING:
    from eagletree.app.workers.sampler import SamplingInputs
    from eagletree.domain.verify import VerifyResult


def drawing_coins(num_steps: int) -> int:
    """Coins one sampling request spends in a step of a drawing chain of depth ``num_steps``."""
    return 2 * num_steps + 1


class ChainDraws:
    """One step's draws for a batch: a ``TopK`` of k = 1 that draws where a top-k would pick.

    ``coins`` (bs, 2·S + 1): the step's coins (``drawing_coins``); ``token_ids`` (V_draft,)
    int64 the target id of each draft column (None: the target's vocabulary). Call it once per
    depth, the root's child first; then ``verify`` the chain. Device work only.
    """

    def __init__(
        self,
        sampling: SamplingInputs,
        coins: torch.Tensor,
        token_ids: torch.Tensor | None,
        num_steps: int,
    ) -> None:
        self._sampling = sampling
        self._coins = coins
        self._token_ids = token_ids
        self._num_steps = num_steps
        self._distributions: list[torch.Tensor] = []  # per depth (bs, V_draft) float32
        self._drawn: list[torch.Tensor] = []  # per depth (bs,) float32

    def __call__(
        self, logits: torch.Tensor, k: int, token_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next depth's draft of every row from ``logits`` (bs, V_draft) → (its probability
        (bs, 1) float32, its target token (bs, 1) int64). ``token_ids``: the forward's column
        map, the draft's own (``__init__``'s), which the root's child is mapped by too."""
        depth = len(self._drawn)
        assert k == 1 and depth < self._num_steps, (k, depth)
        probs = self._sampling.probs(logits)  # (bs, V_draft)
        column = sample_from_probs(probs, self._coins[:, depth])  # (bs,) int64
        drawn = probs.gather(1, column.unsqueeze(1))  # (bs, 1)
        self._distributions.append(probs)
        self._drawn.append(drawn.squeeze(1))
        tokens = column if self._token_ids is None else self._token_ids[column]
        return drawn, tokens.unsqueeze(1)

    def verify(self, candidates: torch.Tensor, target_probs: torch.Tensor) -> VerifyResult:
        """``candidates`` (bs, S + 1) the chain's nodes, root first; ``target_probs``
        (bs·(S + 1), V) the target's distribution after each (the request's sampling)."""
        s = self._num_steps
        assert len(self._drawn) == s, f"{len(self._drawn)} of {s} drafts drawn"
        bs = candidates.shape[0]
        return verify_chain_sampled(
            candidates,
            target_probs.view(bs, s + 1, -1),
            torch.stack(self._distributions, dim=1),
            torch.stack(self._drawn, dim=1),
            self._coins[:, s : 2 * s],
            self._coins[:, 2 * s],
            self._token_ids,
        )
