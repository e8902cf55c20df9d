"""The device functions a decode step calls where a fused kernel replaces many small ones.

Each has its torch reference in ``domain/`` (the specification, and what the CPU runs) and a
one-launch Triton kernel computing the same bits (what CUDA runs). The container picks the
set; workers take it as a constructor argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from eagletree.domain.accepted_path import accepted_path_ranks
from eagletree.domain.chain_sampling import verify_chain_drawn
from eagletree.domain.coins import uniform_coins
from eagletree.domain.compaction import CompactionPlan, compaction_plan
from eagletree.domain.draft_lag import plain_step_writes
from eagletree.domain.sampling import (
    greedy_tokens,
    sample_from_probs,
    tempered_probs,
    top_k_probs,
)
from eagletree.domain.tree import BeamStep, DraftTree, beam_step, build_tree
from eagletree.domain.tree_sampling import draw_children, verify_tree_drawn
from eagletree.domain.verify import VerifyResult, verify_tree_greedy

# (seeds (bs,) int64, offsets (bs,) int64, count) -> (bs, count) float32 coins in [0, 1)
CoinSource = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
# logits (rows, V) -> (rows,) int64, each row's first maximum
Argmax = Callable[[torch.Tensor], torch.Tensor]


class TemperedProbs(Protocol):
    """domain.sampling.tempered_probs's signature: (logits (rows, V), temperature (rows,),
    out (rows, V) float32 or None) -> (rows, V) float32, one-hot rows where the temperature is
    <= 0, written into ``out`` where given."""

    def __call__(
        self, logits: torch.Tensor, temperature: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor: ...


# domain.sampling.sample_from_probs's signature: (probs (rows, V) non-negative, coins (rows,))
# -> (rows,) int64, each row's inverse-CDF sample
SampleFromProbs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TopK(Protocol):
    """domain.sampling.top_k_probs's signature: (logits (rows, V), k, token_ids (V,) int64 or
    None) -> (probabilities (rows, k) float32, tokens (rows, k) int64), the tokens already
    mapped through ``token_ids`` (a draft's column -> target id map) when given."""

    def __call__(
        self, logits: torch.Tensor, k: int, token_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


# domain.tree.build_tree's signature (keyword seq_lens_sum included)
TreeBuild = Callable[..., DraftTree]
# domain.tree.beam_step's signature: (step, topk_p, topk_index, hidden, scores, ancestors,
# own_slots, k) -> (BeamStep, ancestors)
BeamStepFn = Callable[..., tuple[BeamStep, torch.Tensor]]
# domain.compaction.compaction_plan's signature
PlanCompaction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], CompactionPlan]
# domain.accepted_path.accepted_path_ranks's signature: (parents (bs, N), accept_index
# (bs, S + 1), accept_length (bs,)) -> (bs, 2·S) int64 ranks then offers
PathRanks = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# domain.verify.verify_tree_greedy's signature
GreedyVerify = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], VerifyResult
]
# domain.tree_sampling.draw_children's signature: (probs (rows, V), coins (rows, k)) ->
# (columns, scores), each (rows, k)
DrawChildren = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# domain.tree_sampling.verify_tree_drawn's signature
DrawnVerify = Callable[..., VerifyResult]
# domain.chain_sampling.verify_chain_drawn's signature: (candidates (bs, S + 1), target_probs
# (bs, S + 1, V), draft_probs (bs, S, V_draft), coins (bs, S), bonus_coins (bs,), token_ids)
DrawnChainVerify = Callable[..., VerifyResult]
# domain.draft_lag.plain_step_writes's signature: (rows, tokens, features, seq_lens, lag_tokens,
# lag_features, lag_count, committed, pending or None) -> None, writing the last five
PlainStepWrites = Callable[..., None]


class StepKernels(NamedTuple):
    """Sampling coins, the greedy argmax, the tempered softmax, a row's inverse-CDF sample,
    the draft's top-k, the beam step, the verify tree, greedy tree verification, the compaction
    plan, the accepted path's ranks, a plain step's per-row writes, a drawn node's children and
    the verification of drawn trees and of drawn chains (defaults: the torch references)."""

    coins: CoinSource = uniform_coins
    argmax: Argmax = greedy_tokens
    tempered_probs: TemperedProbs = tempered_probs
    sample: SampleFromProbs = sample_from_probs
    top_k: TopK = top_k_probs
    build_tree: TreeBuild = build_tree
    beam_step: BeamStepFn = beam_step
    compaction_plan: PlanCompaction = compaction_plan
    verify_greedy: GreedyVerify = verify_tree_greedy
    path_ranks: PathRanks = accepted_path_ranks
    plain_step_writes: PlainStepWrites = plain_step_writes
    draw_children: DrawChildren = draw_children
    verify_drawn: DrawnVerify = verify_tree_drawn
    verify_chain: DrawnChainVerify = verify_chain_drawn


REFERENCE_KERNELS = StepKernels()
