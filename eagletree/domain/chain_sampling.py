"""Domain: reference semantics of a chain of *sampled* drafts, verified by speculative sampling.

A tree of top-k drafts is verified target-only (``verify.verify_tree_sampling``): a node is taken
with the target's probability p(x) of its token, so a chain of argmax drafts accepts each depth
with probability p(argmax q). At temperature 1 the target spreads p over many tokens and its
argmax is taken far less often than at temperature 0, wherever the draft agrees with it.

A chain whose drafts are *drawn* from the draft's own distribution q (at the request's temperature,
top-k and top-p) is verified as Leviathan et al. and Chen et al. (2023) do: the draft x at depth d
is accepted with probability min(1, p(x) / q(x)), p the target's distribution there; the first
rejection draws the bonus from the residual max(0, p − q), renormalised; a chain accepted to its
end draws the bonus from the target after its last draft. Whatever q is, every emitted token
follows p (lossless), and a depth is accepted with probability Σ_x min(p(x), q(x)) = 1 − TV(p, q):
a draft that spreads as the target does is taken however spread both are.

Greedy requests in a sampling batch have one-hot p and q (their argmaxes): a draft is accepted iff
it is the target's argmax, and the residual is the target's argmax — the greedy chain's rule.

A step that draws its chain keeps the rows its drafts were drawn from, not the drawn tokens'
probabilities: ``verify_chain_drawn`` reads those from the rows (the worker's chain walk, which
the Triton kernel matches). The drawn trees' walk (``tree_sampling.verify_tree_drawn``) over a
tree of width one is this rule too: the tests hold them equal.
"""

from __future__ import annotations

import torch

from eagletree.domain.sampling import sample_from_probs
from eagletree.domain.tree_sampling import draft_columns
from eagletree.domain.verify import VerifyResult


def verify_chain_sampled(
    candidates: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_probs: torch.Tensor,
    coins: torch.Tensor,
    bonus_coins: torch.Tensor,
    token_ids: torch.Tensor | None = None,
) -> VerifyResult:
    """Speculative sampling along each request's chain of S sampled drafts.

    ``candidates`` (bs, S + 1) int64: the root (the pending token) then the drafts, in target ids;
    ``target_probs`` (bs, S + 1, V) float32: the target's distribution after each node (temperature,
    top-k, top-p applied; one-hot rows for greedy requests); ``draft_probs`` (bs, S, V_draft): the
    distribution each draft was drawn from, over the draft's columns, which ``token_ids``
    (V_draft,) name in target ids (None: column i is token i); ``draft_token_probs`` (bs, S): the
    probability each draft had when drawn; ``coins`` (bs, S) and ``bonus_coins`` (bs,) uniform in
    [0, 1). Node i of request b is global node b·(S + 1) + i, as a chain's tree numbers them.
    """
    bs, n = candidates.shape
    depth = n - 1
    device = candidates.device
    drafts = candidates[:, 1:].long()  # (bs, S)
    p_draft = target_probs[:, :depth].gather(2, drafts.unsqueeze(2)).squeeze(2)  # (bs, S)
    # coin < p / q, without a division: a drawn draft has q > 0, a one-hot greedy row q = 1
    accepted = coins * draft_token_probs < p_draft
    accept_length = accepted.long().cumprod(dim=1).sum(dim=1)  # (bs,)
    # the bonus: from the residual at the first rejected depth, else from the last node's target
    at = accept_length.view(bs, 1, 1)
    target_row = target_probs.gather(1, at.expand(bs, 1, target_probs.shape[2])).squeeze(1)
    rejected_at = accept_length.clamp(max=depth - 1).view(bs, 1, 1)
    draft_row = draft_probs.gather(1, rejected_at.expand(bs, 1, draft_probs.shape[2])).squeeze(1)
    if token_ids is not None:  # the draft's columns into the target's vocabulary
        draft_row = torch.zeros_like(target_row).index_copy_(1, token_ids, draft_row.float())
    full = (accept_length == depth).unsqueeze(1)
    residual = torch.where(full, target_row, (target_row - draft_row).clamp(min=0.0))
    # p == q leaves no residual, and then nothing is ever rejected there: any row will do
    usable = residual.sum(dim=1, keepdim=True) > 0
    bonus = sample_from_probs(torch.where(usable, residual, target_row), bonus_coins)
    # node i < a predicts the next draft, node a the bonus, the rest nothing
    nodes = torch.arange(n, device=device).unsqueeze(0)  # (1, S + 1)
    padded = torch.cat([drafts, drafts.new_zeros(bs, 1)], dim=1)  # (bs, S + 1)
    length = accept_length.unsqueeze(1)
    predict = torch.where(nodes < length, padded, -1)
    predict = torch.where(nodes == length, bonus.unsqueeze(1), predict)
    global_nodes = torch.arange(bs, device=device).unsqueeze(1) * n + nodes
    accept_index = torch.where(nodes <= length, global_nodes, -1)
    return VerifyResult(
        predict=predict.reshape(-1).to(torch.int32),
        accept_index=accept_index.to(torch.int32),
        accept_length=accept_length.to(torch.int32),
    )


def verify_chain_drawn(
    candidates: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    coins: torch.Tensor,
    bonus_coins: torch.Tensor,
    token_ids: torch.Tensor | None = None,
) -> VerifyResult:
    """``verify_chain_sampled`` with each draft's probability read from the row it was drawn
    from: ``draft_probs`` (bs, S, V_draft) row d is the distribution draft d + 1 was drawn
    from; the other arguments as there."""
    drafts = candidates[:, 1:].long()  # (bs, S) target ids
    if token_ids is not None:  # each draft's column
        drafts = draft_columns(token_ids, target_probs.shape[2])[drafts]
    drawn_p = draft_probs.gather(2, drafts.unsqueeze(2)).squeeze(2)  # (bs, S)
    return verify_chain_sampled(
        candidates, target_probs, draft_probs, drawn_p, coins, bonus_coins, token_ids
    )
