"""Adapter helper: dense fp32 attention with an explicit boolean mask and its log-sum-exp."""

from __future__ import annotations

import torch


def masked_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    logit_cap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of padded query rows over padded keys, grouped-query aware.

    Returns (o, lse): o (bs, n, H, Dv) fp32, 0 on rows that see no key; lse (bs, n, H) fp32 natural
    log-sum-exp of the scaled (and capped) scores, −inf on rows that see no key.
    """
    # queries: (bs, n, H, Dk); keys: (bs, S, Hk, Dk); values: (bs, S, Hk, Dv); visible: (bs, n, S)
    bs, n, num_heads, head_dim = queries.shape
    num_keys, kv_heads = keys.shape[1], keys.shape[2]
    group = num_heads // kv_heads
    q = queries.float().view(bs, n, kv_heads, group, head_dim)
    scores = torch.einsum("bnhgd,bshd->bhgns", q, keys.float()) * scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible.view(bs, 1, 1, n, num_keys), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (bs, Hk, G, n)
    empty = torch.isneginf(lse).unsqueeze(-1)
    probs = torch.where(empty, 0.0, torch.exp(scores - lse.unsqueeze(-1)))
    o = torch.einsum("bhgns,bshd->bnhgd", probs, values.float())
    return o.reshape(bs, n, num_heads, -1), lse.permute(0, 3, 1, 2).reshape(bs, n, num_heads)


def merge_by_lse(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> torch.Tensor:
    """Combine two attention states over disjoint key sets into the state over their union.

    ``lse`` is the natural log-sum-exp of each part (−inf: the part saw no key); the result is fp32.
    """
    # o1, o2: (tokens, H, Dv); lse1, lse2: (tokens, H)
    top = torch.maximum(lse1, lse2)
    top = torch.where(torch.isneginf(top), 0.0, top)
    w1 = torch.exp(lse1 - top).unsqueeze(-1)
    w2 = torch.exp(lse2 - top).unsqueeze(-1)
    total = w1 + w2
    merged = (o1.float() * w1 + o2.float() * w2) / torch.where(total > 0, total, 1.0)
    return merged
