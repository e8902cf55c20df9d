"""The drafts of a step that draws them: each node's children drawn from the draft's
distribution at its request's sampling (temperature, top-k, top-p), without replacement, with
the step's coins, and what each was drawn from kept for the verification: recursive rejection
sampling over the tree (``domain.tree_sampling``), which over a chain (a tree of width one) is
speculative sampling (``domain.chain_sampling``, a chain's own kernels: a depth's acceptance
reads two numbers, so every depth's sums are taken at once). A node is then accepted with
probability 1 − TV(p, q) rather than the target's probability of the draft's top token, which at
temperature 1 is far less.

Greedy requests in the batch keep the draft's top k (their argmax chain, where k = 1), verified
by the same walk, which accepts exactly their target's argmax path.

Coins a sampling request spends a step (``drawing_coins``), in this order: one per drafted
candidate, at its flat candidate id (k for the root's children, k² per later depth: the same
numbering as ``domain.tree``'s), one acceptance coin per verified node but the root, the
bonus's: 2·S + 1 for a chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels

if TYPE_CHECKING:
    from eagletree.app.workers.sampler import SamplingInputs
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.domain.tree import DraftTree
    from eagletree.domain.verify import VerifyResult


def drawing_coins(shape: DraftShape) -> int:
    """Coins one sampling request spends in a drawing step of ``shape``."""
    return _draw_coins(shape) + shape.num_draft_tokens


def _draw_coins(shape: DraftShape) -> int:
    k = shape.topk
    return k + (shape.num_steps - 1) * k * k


class DraftDraws:
    """One step's draws for a batch: a ``TopK`` that draws where a top-k would pick.

    ``coins`` (bs, ``drawing_coins``): the step's coins; ``token_ids`` (V_draft,) int64 the
    target id of each draft column (None: the target's vocabulary); ``kernels``: the draws, the
    greedy rows' top-k and the drawn tree's verification. Call it once per depth, the root's
    children first (from the root's logits), then once per draft forward; then ``verify`` the
    tree drafted from it. Device work only.
    """

    def __init__(
        self,
        sampling: SamplingInputs,
        coins: torch.Tensor,
        token_ids: torch.Tensor | None,
        shape: DraftShape,
        kernels: StepKernels = REFERENCE_KERNELS,
    ) -> None:
        self._sampling = sampling
        self._coins = coins
        self._token_ids = token_ids
        self._shape = shape
        self._kernels = kernels
        self._distributions: list[torch.Tensor] = []  # per depth (bs, rows a request, V_draft)
        # a chain's: every depth's row written in place (bs, S, V_draft), made at the root
        self._chain: torch.Tensor | None = None

    def __call__(
        self, logits: torch.Tensor, k: int, token_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next depth's children of every row of ``logits`` (rows, V_draft) → (their
        scores (rows, k) float32, their target tokens (rows, k) int64). ``token_ids``: the
        forward's column map, the draft's own (``__init__``'s), which the root's are mapped by."""
        depth = len(self._distributions)
        assert k == self._shape.topk and depth < self._shape.num_steps, (k, depth)
        bs = self._sampling.batch_size
        per_request = logits.shape[0] // max(bs, 1)  # 1 at the root, k later
        start = 0 if depth == 0 else k + (depth - 1) * k * k
        coins = self._coins[:, start : start + per_request * k].reshape(-1, k)  # (rows, k)
        out = None
        if k == 1:  # the verify reads every depth's rows as one block: written there at once
            if depth == 0:
                shape = (bs, self._shape.num_steps, logits.shape[1])
                self._chain = logits.new_empty(shape, dtype=torch.float32)
            assert self._chain is not None
            out = self._chain[:, depth]
        # (rows, V_draft)
        probs = self._sampling.probs(logits, per_request, self._kernels.tempered_probs, out=out)
        columns, scores = self._kernels.draw_children(probs, coins)
        if k > 1:  # greedy rows keep their top k (a one-hot draws one child)
            greedy = (self._sampling.temperature <= 0).repeat_interleave(per_request)
            top_p, top_columns = self._kernels.top_k(logits, k)
            columns = torch.where(greedy.unsqueeze(1), top_columns, columns)
            scores = torch.where(greedy.unsqueeze(1), top_p, scores)
        self._distributions.append(probs.view(bs, per_request, probs.shape[1]))
        tokens = columns if self._token_ids is None else self._token_ids[columns]
        return scores, tokens

    def verify(
        self, candidates: torch.Tensor, target_probs: torch.Tensor, tree: DraftTree
    ) -> VerifyResult:
        """``candidates`` (bs, N) the tree's nodes, root first; ``target_probs`` (bs·N, V) the
        target's distribution after each (the request's sampling)."""
        s, k, n = self._shape.num_steps, self._shape.topk, self._shape.num_draft_tokens
        assert len(self._distributions) == s, f"{len(self._distributions)} of {s} depths drawn"
        bs = candidates.shape[0]
        first = _draw_coins(self._shape)
        coins, bonus = self._coins[:, first : first + n - 1], self._coins[:, first + n - 1]
        if k == 1:  # a chain: its own walk, every depth's sums at once
            assert self._chain is not None
            return self._kernels.verify_chain(
                candidates, target_probs.view(bs, n, -1), self._chain, coins, bonus, self._token_ids
            )
        draft_probs = torch.cat(self._distributions, dim=1)  # (bs, 1 + (S − 1)·k, V_draft)
        root = torch.full((bs, 1), -1, dtype=torch.int64, device=candidates.device)
        return self._kernels.verify_drawn(
            candidates,
            tree.parents,
            torch.cat([root, tree.selected % k], dim=1),
            torch.cat([root, tree.selected // k], dim=1),
            target_probs.view(bs, n, -1),
            draft_probs,
            self._sampling.temperature > 0,
            coins,
            bonus,
            s,
            k,
            self._token_ids,
        )
