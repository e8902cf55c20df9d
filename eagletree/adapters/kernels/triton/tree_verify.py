"""Triton: greedy tree verification, one program per request (``domain.verify`` semantics).

The torch reference turns the sibling links into parent pointers by pointer doubling and then
takes a dozen ops per depth: about 170 small kernels for S = 5. Here a program loads its
request's N-node rows (candidates, links, the target's argmax, node ids) into registers once
and walks them: at the last accepted node it follows ``retrieve_next_token`` and then
``retrieve_next_sibling`` until a child's token equals the target's argmax there, for at most S
depths. Every node is visited at most once over the whole walk, so a program runs at most N
short iterations, each a few register reductions. Outputs equal ``verify_tree_greedy``'s bit
for bit; no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from eagletree.domain.verify import VerifyResult


@triton.jit
def pick(vector, offs, index):
    """``vector[index]`` as a scalar (0 when index is outside): a register reduction, no memory
    read (the tree walks' kernels share it)."""
    return tl.sum(tl.where(offs == index, vector, 0), axis=0)


@triton.jit
def _verify_tree_greedy_kernel(
    candidates_ptr,  # (bs, N)
    retrieve_index_ptr,  # (bs, N)
    next_token_ptr,  # (bs, N)
    next_sibling_ptr,  # (bs, N)
    target_predict_ptr,  # (bs, N)
    predict_ptr,  # (bs·N,) int32 out
    accept_index_ptr,  # (bs, S + 1) int32 out
    accept_length_ptr,  # (bs,) int32 out
    n,
    num_steps,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    valid = offs < n
    row = req * n + offs
    candidate = tl.load(candidates_ptr + row, mask=valid, other=-1).to(tl.int64)
    next_token = tl.load(next_token_ptr + row, mask=valid, other=-1).to(tl.int64)
    next_sibling = tl.load(next_sibling_ptr + row, mask=valid, other=-1).to(tl.int64)
    predict = tl.load(target_predict_ptr + row, mask=valid, other=-1).to(tl.int64)
    node_id = tl.load(retrieve_index_ptr + row, mask=valid, other=0).to(tl.int64)

    offs_s = tl.arange(0, BLOCK_S)
    path = tl.where(offs_s == 0, pick(node_id, offs, 0), -1)
    accepted = offs == 0
    # loop-carried scalars are int64 throughout (the compiler requires a fixed type)
    last = pick(offs.to(tl.int64), offs, 0)  # 0
    length = last
    active = last == 0
    for depth in range(1, num_steps + 1):
        wanted = pick(predict, offs, last)
        child = tl.where(active, pick(next_token, offs, last), -1)
        found = child * 0 - 1
        while (child >= 0) & (found < 0):
            hit = pick(candidate, offs, child) == wanted
            found = tl.where(hit, child, found)
            child = tl.where(hit, child, pick(next_sibling, offs, child))
        active = found >= 0
        path = tl.where(active & (offs_s == depth), pick(node_id, offs, found), path)
        accepted = accepted | (active & (offs == found))
        last = tl.where(active, found, last)
        length += active.to(tl.int64)
    tl.store(predict_ptr + node_id, tl.where(accepted, predict, -1).to(tl.int32), mask=valid)
    tl.store(
        accept_index_ptr + req * (num_steps + 1) + offs_s,
        path.to(tl.int32),
        mask=offs_s < num_steps + 1,
    )
    tl.store(accept_length_ptr + req, length.to(tl.int32))


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
) -> VerifyResult:
    """``domain.verify.verify_tree_greedy`` in one launch; the same arguments and result."""
    # candidates, retrieve_*, target_predict: (bs, N) on one device
    bs, n = candidates.shape
    device = candidates.device
    predict = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    if bs > 0 and n > 0:
        _verify_tree_greedy_kernel[(bs,)](
            candidates.contiguous(),
            retrieve_index.contiguous(),
            retrieve_next_token.contiguous(),
            retrieve_next_sibling.contiguous(),
            target_predict.contiguous(),
            predict,
            accept_index,
            accept_length,
            n,
            num_steps,
            BLOCK_N=max(16, triton.next_power_of_2(n)),
            BLOCK_S=max(16, triton.next_power_of_2(num_steps + 1)),
            num_warps=1,
        )
    return VerifyResult(predict=predict, accept_index=accept_index, accept_length=accept_length)
