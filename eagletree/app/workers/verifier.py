"""Tree verification: one target forward over every tree node, then greedy or sampled acceptance.

The N nodes of request b are verified at window slots ``req_to_token[row, L_b : L_b + N)`` in
node order (TARGET_VERIFY, tree mask), so the target writes their KV there and returns one logit
row per node. Greedy requests accept by argmax; sampling requests use target-only tree sampling
with coins from their own Philox streams (N walk coins and one bonus coin per step, reserved on
the host, computed on the device), or, in a tree whose drafts they drew, rejection sampling
against what each draft was drawn from (``draft_draws``); both are lossless: emitted tokens
follow the target distribution after temperature / top-k / top-p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.draft_draws import drawing_coins
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.domain.batch import ForwardBatch, ForwardMode, TargetVerifySpec
from eagletree.domain.tree import DraftTree, TreeMaskMode
from eagletree.domain.verify import VerifyResult, verify_tree_sampling

if TYPE_CHECKING:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.draft_draws import DraftDraws
    from eagletree.app.workers.sampler import SamplingInputs
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.ports.model import ModelRunner


@dataclass(frozen=True, slots=True)
class Verification:
    """The verify forward's outcome, node-indexed (row ``b·N + i`` is node i of request b).

    A tree worker compacts ``result.predict`` and ``hidden_states`` in place after acceptance
    (k > 1): from then on rows ``b·N + t``, t <= accept_length, hold the accepted path's node t.
    """

    result: VerifyResult
    verify_slots: torch.Tensor  # (bs·N,) int64 the forward's out_cache_loc, chain order
    hidden_states: torch.Tensor  # (bs·N, H) the target's final-normed hidden states
    aux_hidden_states: torch.Tensor | None  # (bs·N, n·H) EAGLE-3 capture, or None


def tree_mask_indptr(tree: DraftTree, window: DecodeWindow, num_draft_tokens: int) -> torch.Tensor:
    """(bs + 1,) int64 offsets of each request's block in ``tree.tree_mask``, on the device."""
    n = num_draft_tokens
    device = window.seq_lens.device
    if tree.mask_mode is TreeMaskMode.QLEN_ONLY:
        stride = n * n  # one launch: an arange with a step, not an arange and a multiply
        return torch.arange(0, (window.batch_size + 1) * stride, stride, device=device)
    sizes = n * (window.seq_lens + n)
    return torch.cat([torch.zeros(1, dtype=torch.int64, device=device), torch.cumsum(sizes, 0)])


class TreeVerifier:
    """Verifies the draft trees of ``shape`` with ``target``; free of host synchronisation. A
    sampling step uses ``num_coins`` coins per request from ``kernels.coins``: N + 1, or, where
    its sampling requests draw their drafts (``draws``), ``drawing_coins``, the draws' included."""

    def __init__(
        self,
        target: ModelRunner,
        shape: DraftShape,
        *,
        kernels: StepKernels = REFERENCE_KERNELS,
        draws: bool = False,
    ) -> None:
        self._target = target
        self.shape = shape
        self._kernels = kernels
        self.draws = draws  # sampling requests draw their drafts (``DraftDraws``)

    @property
    def num_coins(self) -> int:
        if self.draws:
            return drawing_coins(self.shape)
        return self.shape.num_draft_tokens + 1

    def verify(
        self,
        window: DecodeWindow,
        tree: DraftTree,
        sampling: SamplingInputs,
        draws: DraftDraws | None = None,
    ) -> Verification:
        n = self.shape.num_draft_tokens
        bs = window.batch_size
        table = self._target.req_to_token_pool.req_to_token
        verify_slots = window.slots(table, n).reshape(bs * n)
        batch = ForwardBatch(
            mode=ForwardMode.TARGET_VERIFY,
            input_ids=tree.draft_tokens,
            positions=tree.positions,
            seq_lens=window.seq_lens,
            req_pool_indices=window.req_pool_indices,
            out_cache_loc=verify_slots,
            seq_lens_cpu=window.seq_lens_cpu,
            seq_lens_sum=window.seq_lens_sum,
            spec=TargetVerifySpec(
                num_draft_tokens=n,
                tree_mask=tree.tree_mask,
                mask_mode=tree.mask_mode,
                mask_indptr=tree_mask_indptr(tree, window, n),
            ),
        )
        out = self._target.forward(batch)  # logits: (bs·N, V)
        return Verification(
            result=self._accept(out.logits, tree, sampling, draws),
            verify_slots=verify_slots,
            hidden_states=out.hidden_states,
            aux_hidden_states=out.aux_hidden_states,
        )

    def _accept(
        self,
        logits: torch.Tensor,
        tree: DraftTree,
        sampling: SamplingInputs,
        draws: DraftDraws | None,
    ) -> VerifyResult:
        n, num_steps = self.shape.num_draft_tokens, self.shape.num_steps
        bs = sampling.batch_size
        candidates = tree.draft_tokens.view(bs, n)
        links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
        if sampling.all_greedy:
            target_predict = self._kernels.argmax(logits).view(bs, n)
            return self._kernels.verify_greedy(candidates, *links, target_predict, num_steps)
        # every node of request b samples with request b's parameters; a greedy request's
        # one-hot rows accept exactly its argmax path whatever its coins
        probs = sampling.probs(logits, n, self._kernels.tempered_probs)  # (bs·N, V)
        if draws is not None:  # drafts drawn from the draft: rejection sampling against it
            return draws.verify(candidates, probs, tree)
        coins = sampling.coins(self._kernels.coins, n + 1)  # (bs, N + 1)
        return verify_tree_sampling(candidates, *links, probs, coins[:, :n], coins[:, n], num_steps)
