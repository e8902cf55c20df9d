"""Triton: one EAGLE beam step after the first (``select_top_k_tokens``, step ≥ 1), one launch.

For every request the k branches' cumulative scores times their k children's draft
probabilities give k² path scores; the k best survive (ties towards the lower flat index), each
carrying its parent branch's ancestor slots plus the parent's own slot of the forward just run.
The torch reference (``domain.tree.beam_step``: ``select_top_k_tokens`` and the ancestor update)
takes some twenty small kernels per step; here one program per request computes them all in
registers, and the survivors' hidden states are one row gather. Outputs equal the reference's
bit for bit (the products are the same single fp32 multiplies).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.domain.tree import BeamStep


@triton.jit
def _beam_step_kernel(
    scores_ptr,  # (bs, k) float32 branch scores
    topk_p_ptr,  # (bs·k, k) float32 children's draft probabilities
    topk_index_ptr,  # (bs·k, k) int64 children's tokens
    ancestors_ptr,  # (bs·k, depth) int64 ancestor slots of every branch
    own_slots_ptr,  # (bs·k,) int64 each branch's slot of the forward just run
    expand_ptr,  # (bs, k, k) float32 out: path scores
    survivors_ptr,  # (bs, k) int64 out: flat ids k + k²(step − 1) + survivor
    input_ids_ptr,  # (bs·k,) int64 out: survivors' tokens
    new_scores_ptr,  # (bs, k) float32 out
    parent_rows_ptr,  # (bs·k,) int64 out: b·k + parent branch (the hidden state to carry)
    new_ancestors_ptr,  # (bs·k, depth + 1) int64 out
    depth,
    flat_offset,
    K: tl.constexpr,
    BLOCK_KK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    flat = tl.arange(0, BLOCK_KK)
    valid = flat < K * K
    base = req * K * K
    branch_score = tl.load(scores_ptr + req * K + flat // K, mask=valid, other=0.0)
    p = tl.load(topk_p_ptr + base + flat, mask=valid, other=0.0)
    expand = branch_score * p
    tl.store(expand_ptr + base + flat, expand, mask=valid)
    tokens = tl.load(topk_index_ptr + base + flat, mask=valid, other=0)

    offs_k = tl.arange(0, BLOCK_K)
    survivor = tl.zeros([BLOCK_K], tl.int64)
    taken = ~valid
    for j in tl.static_range(K):
        best = tl.max(tl.where(taken, float("-inf"), expand), axis=0)
        pick = tl.min(tl.where((~taken) & (expand == best), flat, BLOCK_KK), axis=0)
        survivor = tl.where(offs_k == j, pick.to(tl.int64), survivor)
        taken = taken | (flat == pick)
    k_ok = offs_k < K
    # every survivor's token and score, read back from the registers by its flat index
    chosen = flat[None, :] == survivor[:, None]  # (BLOCK_K, BLOCK_KK)
    token = tl.sum(tl.where(chosen, tokens[None, :], 0), axis=1)
    score = tl.sum(tl.where(chosen, expand[None, :], 0.0), axis=1)
    parent = survivor // K
    rows = req * K + offs_k
    tl.store(survivors_ptr + rows, survivor + flat_offset, mask=k_ok)
    tl.store(input_ids_ptr + rows, token, mask=k_ok)
    tl.store(new_scores_ptr + rows, score, mask=k_ok)
    tl.store(parent_rows_ptr + rows, req * K + parent, mask=k_ok)

    # the survivor's path: its parent branch's ancestors, then the parent's own slot
    offs_d = tl.arange(0, BLOCK_D)
    source = req * K + parent
    old = tl.load(
        ancestors_ptr + source[:, None] * depth + offs_d[None, :],
        mask=k_ok[:, None] & (offs_d[None, :] < depth),
        other=0,
    )
    own = tl.load(own_slots_ptr + source, mask=k_ok, other=0)
    path = tl.where(offs_d[None, :] == depth, own[:, None], old)
    tl.store(
        new_ancestors_ptr + rows[:, None] * (depth + 1) + offs_d[None, :],
        path,
        mask=k_ok[:, None] & (offs_d[None, :] <= depth),
    )


def beam_step(
    step: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    scores: torch.Tensor,
    ancestors: torch.Tensor,
    own_slots: torch.Tensor,
    topk: int,
) -> tuple[BeamStep, torch.Tensor]:
    """Beam step ``step >= 1`` and the survivors' ancestor slots (bs·k, step), in one launch."""
    # topk_p, topk_index: (bs·k, k); hidden_states: (bs·k, H); scores: (bs, k);
    # ancestors: (bs·k, step − 1); own_slots: (bs·k,)
    k = topk
    bs = scores.shape[0]
    device = scores.device
    depth = step - 1
    expand = torch.empty(bs, k, k, dtype=torch.float32, device=device)
    survivors = torch.empty(bs, k, dtype=torch.int64, device=device)
    input_ids = torch.empty(bs * k, dtype=torch.int64, device=device)
    new_scores = torch.empty(bs, k, dtype=torch.float32, device=device)
    parent_rows = torch.empty(bs * k, dtype=torch.int64, device=device)
    new_ancestors = torch.empty(bs * k, depth + 1, dtype=torch.int64, device=device)
    if bs > 0:
        _beam_step_kernel[(bs,)](
            scores.float().contiguous(),
            topk_p.float().contiguous(),
            topk_index.to(torch.int64).contiguous(),
            ancestors.to(torch.int64).contiguous() if ancestors.numel() else own_slots,
            own_slots.to(torch.int64).contiguous(),
            expand,
            survivors,
            input_ids,
            new_scores,
            parent_rows,
            new_ancestors,
            depth,
            k * k * (step - 1) + k,
            K=k,
            BLOCK_KK=max(16, triton.next_power_of_2(k * k)),
            BLOCK_K=max(2, triton.next_power_of_2(k)),
            BLOCK_D=max(2, triton.next_power_of_2(depth + 1)),
        )
    beam = BeamStep(
        input_ids=input_ids,
        hidden_states=hidden_states.index_select(0, parent_rows),
        scores=new_scores,
        tree_info=(expand, topk_index.view(bs, k * k), survivors),
    )
    return beam, new_ancestors
