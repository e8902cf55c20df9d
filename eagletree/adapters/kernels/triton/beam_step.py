"""Triton: one EAGLE beam step after the first (``select_top_k_tokens``, step ≥ 1), one launch.

For every request the k branches' cumulative scores times their k children's draft
probabilities give k² path scores; the k best survive (ties towards the lower flat index), each
carrying its parent branch's ancestor slots plus the parent's own slot of the forward just run.
The torch reference (``domain.tree.beam_step``: ``select_top_k_tokens`` and the ancestor update)
takes some twenty small kernels per step; here one program per request computes them all in
registers, then copies each survivor's parent hidden state into the next forward's input rows
(a separate row gather would be one more launch per draft depth, at bs 1 about as long as the
beam step itself). Outputs equal the reference's bit for bit (the products are the same single
fp32 multiplies; the hidden rows are copied, not computed).
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
    new_ancestors_ptr,  # (bs·k, depth + 1) int64 out
    hidden_ptr,  # (bs·k, H) the branches' hidden states, rows hidden_stride apart
    new_hidden_ptr,  # (bs·k, H) out, contiguous: each survivor's parent's row
    depth,
    flat_offset,
    hidden_size,
    hidden_stride,
    K: tl.constexpr,
    BLOCK_KK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
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

    # the survivor's hidden state: its parent branch's row
    offs_h = tl.arange(0, BLOCK_H)
    for start in range(0, hidden_size, BLOCK_H):
        cols = start + offs_h
        keep = k_ok[:, None] & (cols[None, :] < hidden_size)
        row = tl.load(hidden_ptr + source[:, None] * hidden_stride + cols[None, :], mask=keep)
        tl.store(new_hidden_ptr + rows[:, None] * hidden_size + cols[None, :], row, mask=keep)


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
    hidden_size = hidden_states.shape[1]
    if hidden_states.stride(1) != 1:
        hidden_states = hidden_states.contiguous()
    new_hidden = torch.empty(bs * k, hidden_size, dtype=hidden_states.dtype, device=device)
    block_k = max(2, triton.next_power_of_2(k))
    expand = torch.empty(bs, k, k, dtype=torch.float32, device=device)
    survivors = torch.empty(bs, k, dtype=torch.int64, device=device)
    input_ids = torch.empty(bs * k, dtype=torch.int64, device=device)
    new_scores = torch.empty(bs, k, dtype=torch.float32, device=device)
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
            new_ancestors,
            hidden_states,
            new_hidden,
            depth,
            k * k * (step - 1) + k,
            hidden_size,
            hidden_states.stride(0),
            K=k,
            BLOCK_KK=max(16, triton.next_power_of_2(k * k)),
            BLOCK_K=block_k,
            BLOCK_D=max(2, triton.next_power_of_2(depth + 1)),
            # about 4k elements a round of the copy, whatever k is
            BLOCK_H=max(16, min(triton.next_power_of_2(hidden_size), 4096 // block_k)),
        )
    beam = BeamStep(
        input_ids=input_ids,
        hidden_states=new_hidden,
        scores=new_scores,
        tree_info=(expand, topk_index.view(bs, k * k), survivors),
    )
    return beam, new_ancestors
