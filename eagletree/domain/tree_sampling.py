"""Domain: reference semantics of a tree of *drawn* drafts, verified by recursive rejection
sampling without replacement.

A node's k children are drawn from the draft's distribution q there without replacement (each
from q with the earlier ones removed, renormalised), in draw order. The verify walks the
children of the last accepted node in draw order, as SpecInfer and Sequoia do: child i, drawn
from q_i (q without children 1..i − 1), is accepted with probability min(1, p_i(x) / q_i(x));
a rejection replaces p_i by the residual max(0, p_i − q_i), renormalised, for the next child;
when every verified child is rejected the bonus is drawn from the last residual, and after the
last depth from the target. Whatever q is, every emitted token follows p (lossless), and a node
is accepted with probability Σ min(p_i, q_i) — a spread draft is taken however spread both are,
where a tree of top-k drafts (``verify.verify_tree_sampling``) takes a node with p(x) only.

That holds only if the children a node verifies are the *first* m of its draw order, with m
chosen without looking at the children's tokens. EAGLE picks a tree's nodes by path score, so
the scores must not look at them either: ``draw_children`` scores child i by what is known
before it is drawn, kept non-increasing in draw order, so that any cut by score keeps a prefix
of each node's children (score ties go to the earlier child: the lower flat id). The first draw
scores ``FIRST_DRAW_SCORE``: it is accepted with 1 − TV(p, q), 0.63–0.77 a depth on average for
the CPU pair's trained heads, which Σ q² (small for a spread head) underrates where the target
spreads as the head does; a later one, reached only after the earlier ones were rejected,
the chance that a target distributed as q takes it given that it took none of them,
``(Σ q² − Σ_{j<i} q(x_j)²) / (1 − Σ_{j<i} q(x_j))`` (the collision probability of what is
left): low where the head was sure of what it drew, high where it spread.

Greedy requests in such a batch keep their top-k picks (``drawn`` False): each child is then
"drawn" from the one-hot distribution on its token, and the walk is the target-only rule, which
with a greedy row's one-hot p accepts exactly the target's argmax path.
"""

from __future__ import annotations

import torch

from eagletree.domain.sampling import sample_from_probs
from eagletree.domain.verify import VerifyResult

# a first draw's score (its acceptance, 1 − TV(p, q), is 0.63–0.77 a depth for the CPU pair's
# heads at T 0.7–1): what weighs it against the later draws' collision probabilities
FIRST_DRAW_SCORE = 0.7


def draft_columns(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Each target id's column in a draft vocabulary of ``token_ids`` (V_draft,) target ids:
    (vocab,) int64, -1 for an id the draft cannot propose."""
    columns = torch.full((vocab,), -1, dtype=torch.int64, device=token_ids.device)
    columns[token_ids] = torch.arange(token_ids.numel(), device=token_ids.device)
    return columns


def draw_children(probs: torch.Tensor, coins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` children of every row without replacement, in draw order.

    ``probs`` (rows, V) float32, each row a distribution; ``coins`` (rows, k) uniform in [0, 1).
    Returns (columns (rows, k) int64, scores (rows, k) in [0, 1], non-increasing along each row:
    ``FIRST_DRAW_SCORE``, then the collision probability of what the earlier draws left). A draw
    after the row's support ran out is a placeholder (column 0) scored 0, which a verify never
    accepts. (A drawn child's probability is not returned: a verify reads it from the row it was
    drawn from.)
    """
    rows, k = coins.shape
    remaining = probs.float()
    bound = torch.full((rows,), FIRST_DRAW_SCORE, dtype=remaining.dtype, device=probs.device)
    columns, scores = [], []
    for i in range(k):
        mass = remaining.sum(dim=1)  # (rows,) what the earlier draws left, exactly 0 when none
        live = mass > 0
        if i > 0:  # Σ of what is left of q², over its mass: no cancellation as draws take most
            estimate = (remaining * remaining).sum(dim=1) / mass.clamp(min=1e-30)
            bound = torch.minimum(bound, estimate)
        bound = torch.where(live, bound, 0.0)
        column = sample_from_probs(remaining, coins[:, i])  # (rows,)
        columns.append(column)
        scores.append(bound)
        remaining = remaining.scatter(1, column.unsqueeze(1), 0.0)
    return torch.stack(columns, dim=1), torch.stack(scores, dim=1)


def verify_tree_drawn(
    candidates: torch.Tensor,
    parents: torch.Tensor,
    ranks: torch.Tensor,
    sources: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drawn: torch.Tensor,
    coins: torch.Tensor,
    bonus_coins: torch.Tensor,
    num_steps: int,
    topk: int,
    token_ids: torch.Tensor | None = None,
) -> VerifyResult:
    """Recursive rejection sampling over each request's tree of drawn drafts.

    ``candidates`` (bs, N) int64: node tokens in target ids, node 0 the root; ``parents`` (bs, N)
    each node's parent (−1 for the root); ``ranks`` (bs, N) its place in its parent's draw order
    (siblings verified must be ranks 0..m − 1); ``sources`` (bs, N) the row of ``draft_probs``
    (bs, D, V_draft) it was drawn from, over the draft's columns that ``token_ids`` (V_draft,)
    names (None: column i is token i); ``target_probs`` (bs, N, V) float32 the target's
    distribution after each node (the request's sampling applied); ``drawn`` (bs,) bool: the
    request drew its drafts (else they were picked: a greedy row); ``coins`` (bs, N − 1) the
    acceptance coin of nodes 1..N − 1; ``bonus_coins`` (bs,). Depths up to ``num_steps``,
    children up to ``topk`` a node. No host synchronisation.
    """
    bs, n = candidates.shape
    device = candidates.device
    probs = target_probs.reshape(bs, n, -1)
    vocab = probs.shape[2]
    tokens = candidates.long().clamp(min=0)
    rows = torch.arange(bs, device=device)
    drawn_rows = drawn.view(bs, 1)
    last = torch.zeros(bs, dtype=torch.int64, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    stopped = torch.zeros((bs, vocab), dtype=probs.dtype, device=device)
    node_predict = torch.full((bs, n), -1, dtype=torch.int64, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_index[:, 0] = (rows * n).to(torch.int32)
    for depth in range(1, num_steps + 1):
        p = probs[rows, last]  # (bs, V) the target after the last accepted node
        children = parents == last.unsqueeze(1)  # (bs, N)
        # every child of a node was drawn from one row: read it at the first child
        first = (children & (ranks == 0)).long().argmax(dim=1)
        q = draft_probs[rows, sources[rows, first].clamp(min=0)].float()  # (bs, V_draft)
        if token_ids is not None:  # the draft's columns into the target's vocabulary
            q = torch.zeros((bs, vocab), dtype=q.dtype, device=device).index_copy_(1, token_ids, q)
        remaining = q
        chosen = torch.full((bs,), -1, dtype=torch.int64, device=device)
        for rank in range(topk):
            at = children & (ranks == rank)
            child = at.long().argmax(dim=1)  # (bs,) node index, 0 where there is none
            x = tokens[rows, child]
            mass = remaining.sum(dim=1)
            live = active & (chosen < 0) & at.any(dim=1) & ((mass > 0) | ~drawn)
            q_x = torch.where(drawn, remaining[rows, x] / mass.clamp(min=1e-30), 1.0)
            coin = coins[rows, (child - 1).clamp(min=0)]
            take = live & (coin * q_x < p[rows, x])  # coin < p / q without a division
            chosen = torch.where(take, child, chosen)
            rejected = (live & ~take).unsqueeze(1)
            one_hot = torch.zeros_like(p).scatter_(1, x.unsqueeze(1), 1.0)
            q_i = torch.where(drawn_rows, remaining / mass.clamp(min=1e-30).unsqueeze(1), one_hot)
            left = (p - q_i).clamp(min=0.0)
            total = left.sum(dim=1, keepdim=True)
            # p == q_i leaves no residual, and then nothing is ever rejected there
            p = torch.where(rejected & (total > 0), left / total.clamp(min=1e-30), p)
            remaining = torch.where(rejected, remaining * (1.0 - one_hot), remaining)
        found = chosen >= 0
        stopped = torch.where((active & ~found).unsqueeze(1), p, stopped)
        next_token = torch.where(found, tokens[rows, chosen.clamp(min=0)], -1)
        node_predict[rows, last] = torch.where(active, next_token, node_predict[rows, last])
        accept_index[:, depth] = torch.where(found, rows * n + chosen, -1).to(torch.int32)
        active = active & found
        last = torch.where(found, chosen, last)
    final = torch.where(active.unsqueeze(1), probs[rows, last], stopped)
    usable = final.sum(dim=1, keepdim=True) > 0
    bonus = sample_from_probs(torch.where(usable, final, probs[rows, last]), bonus_coins)
    node_predict[rows, last] = bonus
    accept_length = (accept_index[:, 1:] >= 0).sum(dim=1).to(torch.int32)
    predict = node_predict.reshape(-1).to(torch.int32)  # node i of request b at b·N + i
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
