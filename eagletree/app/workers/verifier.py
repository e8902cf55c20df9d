"""Tree verification: one target forward over every tree node, then greedy or sampled acceptance.

The N nodes of request b are verified at window slots ``req_to_token[row, L_b : L_b + N)`` in
node order (TARGET_VERIFY, tree mask), so the target writes their KV there and returns one logit
row per node. Greedy requests accept by argmax; sampling requests use target-only tree sampling
with coins from their own seeded generators (N walk coins and one bonus coin per step), which is
lossless: emitted tokens follow the target distribution after temperature / top-k / top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.app.forward_batches import to_device
from eagletree.app.sampler import SamplingBatch
from eagletree.domain.batch import ForwardBatch, ForwardMode, TargetVerifySpec
from eagletree.domain.sampling import probs_from_logits
from eagletree.domain.tree import DraftTree, TreeMaskMode
from eagletree.domain.verify import VerifyResult, verify_tree_greedy, verify_tree_sampling

if TYPE_CHECKING:
    from eagletree.app.workers.draft_state import DecodeWindow
    from eagletree.domain.request import Request
    from eagletree.ports.model import ModelRunner


@dataclass(frozen=True, slots=True)
class Verification:
    """The verify forward's outcome, node-indexed (row ``b·N + i`` is node i of request b)."""

    result: VerifyResult
    verify_slots: torch.Tensor  # (bs·N,) int64 the forward's out_cache_loc, chain order
    hidden_states: torch.Tensor  # (bs·N, H) the target's final-normed hidden states
    aux_hidden_states: torch.Tensor | None  # (bs·N, n·H) EAGLE-3 capture, or None


def tree_mask_indptr(tree: DraftTree, window: DecodeWindow, num_draft_tokens: int) -> torch.Tensor:
    """(bs + 1,) int64 offsets of each request's block in ``tree.tree_mask``, on the device."""
    n = num_draft_tokens
    device = window.seq_lens.device
    if tree.mask_mode is TreeMaskMode.QLEN_ONLY:
        return torch.arange(window.batch_size + 1, device=device, dtype=torch.int64) * (n * n)
    sizes = n * (window.seq_lens + n)
    return torch.cat([torch.zeros(1, dtype=torch.int64, device=device), torch.cumsum(sizes, 0)])


def draw_tree_coins(
    requests: Sequence[Request], num_draft_tokens: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk coins (bs, N) and bonus coins (bs,) from each request's generator (greedy: zeros).

    A greedy request's one-hot distribution accepts exactly the argmax child with coin 0, so
    greedy and sampling requests share one sampling walk.
    """
    n = num_draft_tokens
    rows = [
        torch.zeros(n + 1) if r.params.greedy else r.draw_coins(n + 1) for r in requests
    ]  # each (N + 1,) f32 host
    coins = torch.stack(rows) if rows else torch.zeros(0, n + 1)
    coins = to_device(coins, device)
    return coins[:, :n], coins[:, n]


class TreeVerifier:
    """Verifies draft trees with ``target``; free of host synchronisation."""

    def __init__(self, target: ModelRunner, *, num_steps: int, num_draft_tokens: int) -> None:
        self._target = target
        self.num_steps = num_steps
        self.num_draft_tokens = num_draft_tokens

    def verify(
        self, window: DecodeWindow, tree: DraftTree, requests: Sequence[Request]
    ) -> Verification:
        n = self.num_draft_tokens
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
            result=self._accept(out.logits, tree, requests),
            verify_slots=verify_slots,
            hidden_states=out.hidden_states,
            aux_hidden_states=out.aux_hidden_states,
        )

    def _accept(
        self, logits: torch.Tensor, tree: DraftTree, requests: Sequence[Request]
    ) -> VerifyResult:
        n, num_steps = self.num_draft_tokens, self.num_steps
        bs = len(requests)
        candidates = tree.draft_tokens.view(bs, n)
        links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
        sampling = SamplingBatch.from_requests(requests, logits.device)
        if sampling.all_greedy:
            target_predict = logits.argmax(dim=-1).view(bs, n)
            return verify_tree_greedy(candidates, *links, target_predict, num_steps)
        # every node of request b samples with request b's parameters
        probs = probs_from_logits(
            logits,
            sampling.temperature.repeat_interleave(n),
            None if sampling.top_k is None else sampling.top_k.repeat_interleave(n),
            None if sampling.top_p is None else sampling.top_p.repeat_interleave(n),
        )  # (bs·N, V)
        coins, final_coins = draw_tree_coins(requests, n, logits.device)
        return verify_tree_sampling(candidates, *links, probs, coins, final_coins, num_steps)
