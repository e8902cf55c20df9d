"""Per-forward value objects: the forward modes and the request data one forward pass needs.

A `ForwardBatch` carries request data only. The KV pool, the req_to_token pool and the attention
backend belong to the runner that executes the batch, so a batch built for one runner cannot make
another runner read the wrong pool.

Length convention (the same in every mode): `seq_lens[b]` is the number of tokens of request b
whose KV is already in the pool *before* this forward (the committed prefix, `L_b`); the tokens of
this forward are not counted. Queries of this forward attend to `[0, L_b)` through the request's
req_to_token row, and to the new tokens as the mode says:

| mode          | new tokens per request        | what query i of request b attends to            |
|---------------|-------------------------------|-------------------------------------------------|
| EXTEND        | `extend_lens[b]` (ragged)      | prefix + new tokens 0..i (causal)               |
| DECODE        | 1                             | prefix + itself                                 |
| TARGET_VERIFY | N (tree nodes, node order)    | prefix + its tree ancestors + itself (tree mask) |
| DRAFT_DECODE  | k (beam branches)             | prefix + its ancestors' draft slots + itself    |
| DRAFT_EXTEND  | N (fixed width)               | prefix + new tokens 0..i (causal)               |
| IDLE          | 0 (bs == 0)                   | nothing                                         |

Tokens are request-major: request b owns the tokens ``[Σ_{b'<b} n_b', Σ_{b'<=b} n_b')`` (for the
fixed-width modes ``[b·W, (b+1)·W)``; in DRAFT_DECODE token ``b·k + j`` is branch j). The new
tokens' keys are the pool rows at ``out_cache_loc`` (a backend writes them there first unless the
caller already has: ``save_kv=False``), never ``req_to_token[row, L_b:]``. A batch with bs == 0
is valid in every mode and needs no spec.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from eagletree.domain.tree import TreeMaskMode


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"
    TARGET_VERIFY = "target_verify"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class TargetVerifySpec:
    """Tree verification: N nodes per request under the tree mask of `domain.tree.build_tree`."""

    num_draft_tokens: int
    # FULL_MASK: Σ_b N·(L_b + N) bools, request blocks concatenated, rows of length L_b + N.
    # QLEN_ONLY: bs·N·N bools (the prefix columns are all true and left out).
    # Preconditions (build_tree meets both): a FULL_MASK's prefix columns are all true (backends
    # read only the N × N tree part), and row i is true only at tree columns j <= i (a node's
    # ancestors precede it), so a query never sees a later node.
    tree_mask: torch.Tensor
    mask_mode: TreeMaskMode
    # (bs + 1,) int64 offsets of each request's block in `tree_mask` (cumsum of N·(L_b + N) or
    # of N·N); computed on the device so that no host sync is needed.
    mask_indptr: torch.Tensor


@dataclass(frozen=True, slots=True)
class DraftDecodeSpec:
    """One draft step over k beam branches per request (`topk` queries per request)."""

    topk: int
    # (bs·k, depth) int64: the draft KV slots of each branch's true ancestors along its beam
    # path, oldest first, written by earlier draft steps; the branch's own slot is
    # `out_cache_loc` and is not listed. depth == 0 at the first draft forward. Row b·k + j
    # belongs to branch j of request b (token b·k + j).
    ancestor_slots: torch.Tensor


@dataclass(frozen=True, slots=True)
class DraftExtendSpec:
    """Draft-extend over a fixed width of N rows per request, causal."""

    num_tokens_per_request: int


SpecInfo = TargetVerifySpec | DraftDecodeSpec | DraftExtendSpec


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """The request data of one forward pass; see the module docstring for the conventions."""

    mode: ForwardMode
    input_ids: torch.Tensor  # (num_tokens,) int64
    positions: torch.Tensor  # (num_tokens,) int64 rotary positions
    seq_lens: torch.Tensor  # (bs,) int64 committed prefix lengths L_b (new tokens excluded)
    req_pool_indices: torch.Tensor  # (bs,) int64 rows of the runner's req_to_token table
    out_cache_loc: torch.Tensor  # (num_tokens,) int64 KV slot of each new token (its key's row)
    extend_lens: torch.Tensor | None = None  # (bs,) int64, EXTEND only: new tokens per request
    seq_lens_cpu: torch.Tensor | None = None  # host copy of seq_lens; None for a GPU-only batch
    seq_lens_sum: int | None = None  # Σ seq_lens; None for a GPU-only batch
    extend_lens_cpu: torch.Tensor | None = None  # host copy of extend_lens, EXTEND only
    spec: SpecInfo | None = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @staticmethod
    def idle(device: torch.device | str = "cpu") -> ForwardBatch:
        """An empty batch (bs == 0), e.g. for a data-parallel rank with no requests."""
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return ForwardBatch(
            mode=ForwardMode.IDLE,
            input_ids=empty,
            positions=empty,
            seq_lens=empty,
            req_pool_indices=empty,
            out_cache_loc=empty,
            seq_lens_cpu=torch.empty(0, dtype=torch.int64),
            seq_lens_sum=0,
        )
