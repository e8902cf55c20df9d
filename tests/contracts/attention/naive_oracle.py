"""A naive per-query oracle for the attention contract: plain SDPA over the key list
each query's mode gives it, walked from the case itself."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagletree.domain.batch import DraftDecodeSpec, ForwardMode
from tests.batch_widths import fixed_width
from tests.contracts.attention.cases import AttentionCase


def naive_attention(case: AttentionCase) -> torch.Tensor:
    """Plain SDPA per query and head over an explicit key list → (num_tokens, H·Dv) fp32.

    The key lists come from the mode's meaning, not from the backends' plan: tree ancestors are
    walked through ``DraftTree.parents``; the pool rows are ``case.expected_buffers()``.
    """
    batch, layer = case.batch, case.layer
    buffers = case.expected_buffers()
    if len(buffers) == 1:
        keys_buf = buffers[0].float()
        values_buf = keys_buf[..., : layer.v_head_dim]
    else:
        keys_buf, values_buf = buffers
    table = case.req_to_token.req_to_token.cpu()
    seq_lens = batch.seq_lens.cpu().tolist()
    rows = batch.req_pool_indices.cpu().tolist()
    group = layer.num_q_heads // layer.num_kv_heads
    out = torch.zeros(batch.num_tokens, layer.num_q_heads, layer.v_head_dim)
    token = 0
    for b, prefix in enumerate(seq_lens):
        prefix_slots = table[rows[b], :prefix].tolist()
        tails = _tail_lists(case, b, token)
        for i, tail in enumerate(tails):
            slots = torch.tensor(prefix_slots + tail, dtype=torch.int64)
            keys = keys_buf.cpu()[slots].float()  # (len, Hk, Dk)
            values = values_buf.cpu()[slots].float()
            for h in range(layer.num_q_heads):
                query = case.q[token + i, h].cpu().float().view(1, 1, -1)
                out[token + i, h] = F.scaled_dot_product_attention(
                    query,
                    keys[:, h // group].unsqueeze(0),
                    values[:, h // group].unsqueeze(0),
                    scale=layer.scaling,
                ).view(-1)
        token += len(tails)
    return out.view(batch.num_tokens, layer.num_q_heads * layer.v_head_dim)


def _tail_lists(case: AttentionCase, b: int, first_token: int) -> list[list[int]]:
    """For each query of request b, the slots of the tail keys it sees."""
    batch = case.batch
    slots = batch.out_cache_loc.cpu().tolist()
    mode = batch.mode
    if mode is ForwardMode.EXTEND:
        assert batch.extend_lens is not None
        n = int(batch.extend_lens[b])
        return [slots[first_token : first_token + i + 1] for i in range(n)]
    if mode is ForwardMode.DECODE:
        return [[slots[first_token]]]
    if mode is ForwardMode.DRAFT_EXTEND:
        n = fixed_width(batch)
        return [slots[first_token : first_token + i + 1] for i in range(n)]
    if mode is ForwardMode.TARGET_VERIFY:
        assert case.tree is not None
        parents = case.tree.parents[b].cpu().tolist()
        lists = []
        for i in range(len(parents)):
            chain, node = [], i
            while node >= 0:
                chain.append(slots[first_token + node])
                node = parents[node]
            lists.append(chain[::-1])
        return lists
    assert isinstance(batch.spec, DraftDecodeSpec)
    topk = batch.spec.topk
    ancestors = batch.spec.ancestor_slots.cpu().tolist()
    return [ancestors[b * topk + j] + [slots[first_token + j]] for j in range(topk)]
