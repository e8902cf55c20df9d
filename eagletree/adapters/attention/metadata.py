"""Adapter helper: the per-forward attention plan shared by every backend (what each query sees).

Every query of a forward attends to the committed prefix of its request (``req_to_token[row,
:L_b]``) plus some of the request's *tail* keys, as the mode says. The plan names the tail:

| mode          | queries/req | tail keys of request b                | query i sees tail key c  |
|---------------|-------------|---------------------------------------|--------------------------|
| EXTEND        | extend_lens | its new tokens' slots (out_cache_loc) | c <= i (CAUSAL)          |
| DECODE        | 1           | its new token's slot                  | c <= i (CAUSAL)          |
| DRAFT_EXTEND  | N           | its N new tokens' slots               | c <= i (CAUSAL)          |
| TARGET_VERIFY | N           | its N tree nodes' slots               | tree mask [i, c] (TREE)  |
| DRAFT_DECODE  | k           | per branch: D ancestors, then its own | c // (D+1) == i (BRANCH) |

Every tensor is computed on the device from the batch's tensors, without host synchronisation;
the sizes come from host-known shapes (bs, N, k, D) or from optional host copies.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from eagletree.domain.batch import (
    DraftDecodeSpec,
    DraftExtendSpec,
    ForwardBatch,
    ForwardMode,
    TargetVerifySpec,
)
from eagletree.domain.tree import TreeMaskMode


class TailKind(enum.IntEnum):
    """How a query sees its request's tail keys (the values are the Triton kernel's switches)."""

    CAUSAL = 1
    TREE = 2
    BRANCH = 3


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """Layout of one forward: query ranges, tail keys and how they are masked.

    Tokens are request-major: request b owns tokens ``[qo_indptr[b], qo_indptr[b+1])``; for the
    fixed-width modes that is ``[b·width, (b+1)·width)`` (DRAFT_DECODE: token ``b·k + j`` is
    branch j).
    """

    batch: ForwardBatch
    batch_size: int
    num_tokens: int
    tail: TailKind
    width: int  # queries per request for the fixed-width modes, 0 for EXTEND
    tail_width: int  # tail keys per request for the fixed-width modes, 0 for EXTEND
    depth: int  # DRAFT_DECODE: ancestor slots per branch
    max_queries: int  # host upper bound of the queries of one request
    qo_indptr: torch.Tensor  # (bs + 1,) int64 token offsets of the requests
    query_lens: torch.Tensor  # (bs,) int64 queries (= tail keys) of each request
    tree: TargetVerifySpec | None = None
    ancestor_slots: torch.Tensor | None = None  # (bs·k, D) int64, DRAFT_DECODE

    @property
    def is_empty(self) -> bool:
        return self.batch_size == 0 or self.num_tokens == 0


class PlanBuffers:
    """Index buffers an ``AttentionPlan`` is written into, preallocated for CUDA-graph capture.

    ``qo_indptr`` (capacity + 1,) int64 and ``query_lens`` (capacity,) int64 keep their addresses
    for every batch of at most ``capacity`` requests; a larger batch reallocates them (capture
    graphs only after the largest batch, or size ``capacity`` to the engine's maximum).
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self._device = device
        # fixed-width (qo_indptr, query_lens) by (bs, width): read only, so shared by forwards
        self._fixed: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._allocate(max(capacity, 1))

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        # qo_indptr[0] stays 0: the fills below write only [1:] or whole prefixes starting at 0
        self.qo_indptr = torch.zeros(capacity + 1, dtype=torch.int64, device=self._device)
        self.query_lens = torch.zeros(capacity, dtype=torch.int64, device=self._device)

    def fill_fixed(self, bs: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``qo_indptr = [0, W, 2W, …]`` and ``query_lens = W`` for ``bs`` requests: tensors
        written once per (bs, W) and kept, so that a forward (six in a tree step) launches
        nothing for them. While a CUDA graph is being captured a new pair is written into the
        shared buffers instead: a tensor first written during capture holds its values only
        once the graph has run."""
        kept = self._fixed.get((bs, width))
        if kept is not None:
            return kept
        capturing = self._device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing:
            self._ensure(bs)
            qo_indptr, query_lens = self.qo_indptr[: bs + 1], self.query_lens[:bs]
        else:
            qo_indptr = torch.empty(bs + 1, dtype=torch.int64, device=self._device)
            query_lens = torch.empty(bs, dtype=torch.int64, device=self._device)
        torch.mul(torch.arange(bs + 1, device=self._device), width, out=qo_indptr)
        query_lens.fill_(width)
        if not capturing:
            self._fixed[(bs, width)] = (qo_indptr, query_lens)
        return qo_indptr, query_lens

    def fill_ragged(self, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``qo_indptr = [0, cumsum(lens)]`` and ``query_lens = lens``."""
        bs = lens.shape[0]
        self._ensure(bs)
        qo_indptr, query_lens = self.qo_indptr[: bs + 1], self.query_lens[:bs]
        query_lens.copy_(lens)
        torch.cumsum(query_lens, dim=0, out=qo_indptr[1:])
        return qo_indptr, query_lens

    def _ensure(self, bs: int) -> None:
        if bs > self.capacity:
            self._allocate(max(bs, 2 * self.capacity))


def plan_forward(batch: ForwardBatch, buffers: PlanBuffers) -> AttentionPlan:
    """Validate ``batch`` (host-known shapes only) and lay out its queries and tail keys."""
    bs, num_tokens, mode = batch.batch_size, batch.num_tokens, batch.mode
    if bs == 0:  # idle, or any mode with no requests: nothing to attend, no spec needed
        qo_indptr, query_lens = buffers.fill_fixed(0, 0)
        return AttentionPlan(
            batch, 0, num_tokens, TailKind.CAUSAL, 0, 0, 0, 0, qo_indptr, query_lens
        )
    if mode is ForwardMode.IDLE:
        raise ValueError(f"an IDLE batch must have no requests, got bs={bs}")
    if mode is ForwardMode.EXTEND:
        if batch.extend_lens is None or batch.extend_lens.shape != (bs,):
            raise ValueError("an EXTEND batch needs extend_lens of shape (bs,)")
        if batch.extend_lens_cpu is not None:
            max_queries = int(batch.extend_lens_cpu.max())  # host tensor: no device sync
        else:
            max_queries = num_tokens
        qo_indptr, query_lens = buffers.fill_ragged(batch.extend_lens.to(torch.int64))
        return AttentionPlan(
            batch, bs, num_tokens, TailKind.CAUSAL, 0, 0, 0, max_queries, qo_indptr, query_lens
        )

    spec = batch.spec
    tree: TargetVerifySpec | None = None
    ancestors: torch.Tensor | None = None
    depth = 0
    if mode is ForwardMode.DECODE:
        tail, width, tail_width = TailKind.CAUSAL, 1, 1
    elif mode is ForwardMode.DRAFT_EXTEND:
        if not isinstance(spec, DraftExtendSpec):
            raise ValueError(f"a DRAFT_EXTEND batch needs a DraftExtendSpec, got {spec!r}")
        width = spec.num_tokens_per_request
        tail, tail_width = TailKind.CAUSAL, width
    elif mode is ForwardMode.TARGET_VERIFY:
        if not isinstance(spec, TargetVerifySpec):
            raise ValueError(f"a TARGET_VERIFY batch needs a TargetVerifySpec, got {spec!r}")
        width = spec.num_draft_tokens
        tail, tail_width, tree = TailKind.TREE, width, spec
        _check_tree_spec(spec, bs)
    elif mode is ForwardMode.DRAFT_DECODE:
        if not isinstance(spec, DraftDecodeSpec):
            raise ValueError(f"a DRAFT_DECODE batch needs a DraftDecodeSpec, got {spec!r}")
        width, ancestors = spec.topk, spec.ancestor_slots
        if ancestors.dim() != 2 or ancestors.shape[0] != bs * width:
            raise ValueError(
                f"ancestor_slots must be (bs·k, depth) = ({bs * width}, D), "
                f"got {tuple(ancestors.shape)}"
            )
        depth = ancestors.shape[1]
        tail, tail_width = TailKind.BRANCH, width * (depth + 1)
    else:  # pragma: no cover - every ForwardMode is handled above
        raise ValueError(f"unknown forward mode {mode}")
    if num_tokens != bs * width:
        raise ValueError(
            f"a {mode.name} batch of {bs} requests × {width} tokens needs {bs * width} tokens, "
            f"got {num_tokens}"
        )
    qo_indptr, query_lens = buffers.fill_fixed(bs, width)
    return AttentionPlan(
        batch,
        bs,
        num_tokens,
        tail,
        width,
        tail_width,
        depth,
        width,
        qo_indptr,
        query_lens,
        tree=tree,
        ancestor_slots=ancestors,
    )


def _check_tree_spec(spec: TargetVerifySpec, bs: int) -> None:
    n = spec.num_draft_tokens
    if spec.mask_indptr.shape != (bs + 1,):
        raise ValueError(
            f"mask_indptr must be (bs + 1,) = ({bs + 1},), got {spec.mask_indptr.shape}"
        )
    if spec.tree_mask.dim() != 1:
        raise ValueError("tree_mask must be flat (see TargetVerifySpec)")
    if spec.mask_mode is TreeMaskMode.QLEN_ONLY and spec.tree_mask.numel() != bs * n * n:
        raise ValueError(
            f"a QLEN_ONLY tree mask of {bs} requests × N={n} has {bs * n * n} entries, "
            f"got {spec.tree_mask.numel()}"
        )


def tree_tail_mask(spec: TargetVerifySpec, seq_lens: torch.Tensor) -> torch.Tensor:
    """The N × N tree part of every request's mask → (bs, N, N) bool, ``[b, i, j]``: i sees j.

    FULL_MASK rows are ``L_b + N`` long and their prefix columns are ignored (they are all true by
    the ``TargetVerifySpec`` contract); QLEN_ONLY rows are N long.
    """
    n = spec.num_draft_tokens
    bs = seq_lens.shape[0]
    node = torch.arange(n, dtype=torch.int64, device=seq_lens.device)
    start = spec.mask_indptr[:bs].to(torch.int64).view(bs, 1, 1)
    if spec.mask_mode is TreeMaskMode.FULL_MASK:
        lens = seq_lens.to(torch.int64).view(bs, 1, 1)
        index = start + node.view(1, n, 1) * (lens + n) + lens + node.view(1, 1, n)
    else:
        index = start + node.view(1, n, 1) * n + node.view(1, 1, n)
    return spec.tree_mask[index.flatten()].view(bs, n, n).to(torch.bool)


def tree_tail_bits(
    spec: TargetVerifySpec, seq_lens: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The tree part of the mask packed into bits → (bs·N, cdiv(N, 32)) int32, into ``out``.

    Bit ``c % 32`` of word ``c // 32`` of row ``b·N + i`` is set when node i of request b sees
    node c (``tree_tail_mask``); bits past N are clear. Device ops on fixed shapes, no sync;
    with ``out`` (a preallocated buffer of that shape) the result keeps its address.
    """
    mask = tree_tail_mask(spec, seq_lens)  # (bs, N, N) bool
    bs, n = mask.shape[0], spec.num_draft_tokens
    words = (n + 31) // 32
    padded = torch.zeros(bs * n, words * 32, dtype=torch.int64, device=mask.device)
    padded[:, :n] = mask.view(bs * n, n)
    weights = torch.bitwise_left_shift(
        torch.ones(32, dtype=torch.int64, device=mask.device),
        torch.arange(32, dtype=torch.int64, device=mask.device),
    )
    unsigned = (padded.view(bs * n, words, 32) * weights).sum(-1)  # (bs·N, words) in [0, 2³²)
    # as int32 two's complement: words with bit 31 set become negative, exactly
    signed = unsigned - ((unsigned >> 31) << 32)
    if out is None:
        return signed.to(torch.int32)
    return out.copy_(signed)


@dataclass(frozen=True, slots=True)
class TailLayout:
    """Dense per-request view of the plan: padded query rows and tail keys with visibility."""

    query_index: torch.Tensor  # (bs, n) int64 token of each query row (0 on padding rows)
    query_valid: torch.Tensor  # (bs, n) bool
    tail_slots: torch.Tensor  # (bs, T) int64 slots of the tail keys (0 on padding)
    tail_visible: torch.Tensor  # (bs, n, T) bool


def tail_layout(plan: AttentionPlan) -> TailLayout:
    """Padded query rows and tail keys of every request (for dense torch attention)."""
    bs, batch = plan.batch_size, plan.batch
    device = batch.seq_lens.device
    slots = batch.out_cache_loc.to(torch.int64)
    n = plan.max_queries
    local = torch.arange(n, dtype=torch.int64, device=device)
    query_valid = local.view(1, n) < plan.query_lens.view(bs, 1)
    query_index = torch.where(query_valid, plan.qo_indptr[:bs].view(bs, 1) + local, 0)
    if plan.tail is TailKind.CAUSAL:
        tail_slots = torch.where(query_valid, slots[query_index], 0)
        causal = local.view(1, n) <= local.view(n, 1)  # [i, c]
        tail_visible = causal.unsqueeze(0) & query_valid.unsqueeze(1)
    elif plan.tail is TailKind.TREE:
        assert plan.tree is not None
        tail_slots = slots.view(bs, n)
        tail_visible = tree_tail_mask(plan.tree, batch.seq_lens)
    else:
        assert plan.ancestor_slots is not None
        own = slots.view(bs, n, 1)
        ancestors = plan.ancestor_slots.to(torch.int64).view(bs, n, plan.depth)
        tail_slots = torch.cat([ancestors, own], dim=2).view(bs, plan.tail_width)
        branch_of_key = torch.arange(plan.tail_width, device=device) // (plan.depth + 1)
        tail_visible = (
            (branch_of_key.view(1, -1) == local.view(n, 1))
            .unsqueeze(0)
            .expand(bs, n, plan.tail_width)
        )
    return TailLayout(query_index, query_valid, tail_slots, tail_visible)
