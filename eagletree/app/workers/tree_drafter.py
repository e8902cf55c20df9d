"""The draft phase of a speculative step: a width-k beam over S levels, then the verify tree.

Step 0 needs no forward: the root's children come from the previous draft-extend. Each of the
S − 1 draft forwards runs the k surviving branches of every request as one DRAFT_DECODE batch.
Branch j of draft forward i writes its draft KV at window position ``j·S + i`` (slot
``req_to_token[row, L + j·S + i]``) and attends to the committed prefix, to the slots of its
*true* ancestors along the beam and to itself. The beam re-ranks at every level, so a branch's
ancestors are not "branch j's earlier slots": the drafter follows each survivor's parent
pointer and carries the ancestor slot lists along (SGLang reads branch j's own column instead,
which after a re-rank belongs to another path — harmless for correctness, worse for
acceptance).

Positions follow the draft convention (draft row p reads the token at p + 1 and the hidden
state of position p): draft forward i of a request with committed length L sits at L + i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.domain.batch import DraftDecodeSpec, ForwardBatch, ForwardMode
from eagletree.domain.draft_shape import max_draft_tokens
from eagletree.domain.sampling import top_k_probs
from eagletree.domain.tree import (
    BeamStep,
    DraftTree,
    TreeMaskMode,
    beam_step,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)

if TYPE_CHECKING:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.app.workers.step_kernels import BeamStepFn, TopK, TreeBuild
    from eagletree.ports.model import DraftRunner


class TreeDrafter:
    """Drafts one tree per request with ``draft``; owns no state between steps.

    ``draft`` reads the req_to_token rows of its own pool (shared with the target), and the
    window ``[L, L + S·k)`` of each row must be backed (the scheduler's reserve covers it).
    Free of host synchronisation; for bs == 0 every forward still runs, on empty tensors.
    """

    def __init__(
        self,
        draft: DraftRunner,
        *,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        top_k: TopK = top_k_probs,
        build: TreeBuild = build_tree,
        step: BeamStepFn = beam_step,
    ) -> None:
        if num_steps < 1 or topk < 1 or num_draft_tokens < 2:
            raise ValueError(
                f"num_steps={num_steps} and topk={topk} must be >= 1 and num_draft_tokens="
                f"{num_draft_tokens} >= 2"
            )
        if num_draft_tokens > max_draft_tokens(num_steps, topk):
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} exceeds the {topk}-wide, {num_steps}-deep "
                "beam's candidates plus the root"
            )
        self._draft = draft
        self._top_k = top_k
        self._build_tree = build
        self._beam_step = step
        self.num_steps = num_steps
        self.topk = topk
        self.num_draft_tokens = num_draft_tokens
        self.mask_mode = mask_mode
        self.num_forwards = num_steps - 1

    def draft(self, window: DecodeWindow, state: DraftInput, draw: TopK | None = None) -> DraftTree:
        """Run the beam and build the verify tree rooted at each request's bonus token.
        ``draw``: the drafts drawn rather than picked (``DraftDraws``), the root's children
        from the state's logits."""
        k, num_steps = self.topk, self.num_steps
        bs = window.batch_size
        table = self._draft.req_to_token_pool.req_to_token
        # slots_by_forward[i, b·k + j]: the draft KV slot of branch j at draft forward i, and
        # every branch's position before the first forward: laid out once, so that a forward
        # takes a row of each instead of launching its own copies
        branch_slots = window.slots(table, k * num_steps).view(bs, k, num_steps)
        slots_by_forward = branch_slots.permute(2, 0, 1).reshape(num_steps, bs * k)
        first_positions = window.seq_lens[:, None].expand(bs, k).reshape(bs * k)
        topk_p, topk_index = state.topk_p, state.topk_index
        pick = self._top_k
        if draw is not None:
            assert state.logits is not None, "drawn drafts need the root's logits"
            topk_p, topk_index = draw(state.logits, k)
            pick = draw
        beam = select_top_k_tokens(0, topk_p, topk_index, state.hidden_states, None, k)
        steps = [beam]
        ancestors = torch.zeros((bs * k, 0), dtype=torch.int64, device=branch_slots.device)
        for step in range(1, num_steps):
            own_slots = slots_by_forward[step - 1]
            positions = first_positions + (step - 1) if step > 1 else first_positions
            out = self._draft.forward(
                self._branch_batch(window, beam, own_slots, ancestors, positions),
                beam.hidden_states,
            )
            # (bs·k, k) each, the draft's columns already named by their target ids
            topk_p, topk_index = pick(out.logits, k, out.token_ids)
            beam, ancestors = self._beam_step(
                step, topk_p, topk_index, out.hidden_states, beam.scores, ancestors, own_slots, k
            )
            steps.append(beam)
        score_list = [s.tree_info[0] for s in steps]
        token_list = [s.tree_info[1] for s in steps]
        parents_list = [s.tree_info[2] for s in steps]
        parent_list, top_scores_index, draft_tokens = organize_draft_results(
            score_list, token_list, parents_list, self.num_draft_tokens
        )
        return self._build_tree(
            state.bonus_tokens,
            parent_list,
            top_scores_index,
            draft_tokens,
            window.seq_lens,
            k,
            num_steps,
            self.num_draft_tokens,
            self.mask_mode,
            seq_lens_sum=window.seq_lens_sum,
        )

    def _branch_batch(
        self,
        window: DecodeWindow,
        beam: BeamStep,
        own_slots: torch.Tensor,
        ancestors: torch.Tensor,
        positions: torch.Tensor,
    ) -> ForwardBatch:
        k = self.topk
        return ForwardBatch(
            mode=ForwardMode.DRAFT_DECODE,
            input_ids=beam.input_ids.to(torch.int64),
            positions=positions,
            seq_lens=window.seq_lens,
            req_pool_indices=window.req_pool_indices,
            out_cache_loc=own_slots,
            seq_lens_cpu=window.seq_lens_cpu,
            seq_lens_sum=window.seq_lens_sum,
            spec=DraftDecodeSpec(topk=k, ancestor_slots=ancestors),
        )
