"""TreeWorker: the EAGLE tree workers' parts and prefill (v1 and v2 share them).

One draft runner drafts a k-wide beam over S levels per request (``TreeDrafter``) and
re-extends over committed tokens (``DraftExtender``); each request's draft state is a
``DraftInput`` row of a ``DraftStateStore``. The prefill is the draft's extend over the prompt
shifted by one, whose last row proposes the root's children of the first tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eagletree.app.workers.draft_draws import DraftDraws
from eagletree.app.workers.draft_extender import DraftExtender
from eagletree.app.workers.draft_state import DraftStateStore, lag_width
from eagletree.app.workers.speculative_worker import SpeculativeWorker
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.app.workers.tree_drafter import TreeDrafter
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.tree import TreeMaskMode

if TYPE_CHECKING:
    import torch

    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.sampler import SamplingInputs
    from eagletree.app.workers.shapes.policy import ShapePolicy
    from eagletree.app.workers.verifier import Verification
    from eagletree.domain.batch import ForwardBatch
    from eagletree.domain.model_output import ModelOutput
    from eagletree.domain.tree import DraftTree
    from eagletree.ports.model import DraftRunner, ModelRunner


class TreeWorker(SpeculativeWorker):
    """A speculative worker drafting trees of (S, k, N) = (``num_steps``, ``topk``,
    ``num_draft_tokens``) with ``draft``.

    ``draft_hidden_size`` is the width of the draft's own hidden state (what it feeds its next
    draft step); ``use_aux_hidden`` makes the draft read the target's aux hidden states
    (EAGLE-3). ``policy``: the shapes a step may draft, (S, k, N) first; the draft state keeps
    the widest top-k any of them reads (a narrower beam reads its first columns: the top-k is
    sorted); ``draw_drafts``: sampling requests draw their drafts (the state then keeps
    each row's root logits). The rest as ``SpeculativeWorker``'s and ``StepWorker``'s.
    """

    def __init__(
        self,
        target: ModelRunner,
        draft: DraftRunner,
        *,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        draft_hidden_size: int,
        use_aux_hidden: bool = False,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
        device_lengths: bool = True,
        policy: ShapePolicy | None = None,
        draw_drafts: bool = False,
    ) -> None:
        shape = DraftShape(num_steps, topk, num_draft_tokens)
        shapes = (shape,) if policy is None else policy.shapes
        self._drafters = {
            s: TreeDrafter(
                draft,
                num_steps=s.num_steps,
                topk=s.topk,
                num_draft_tokens=s.num_draft_tokens,
                mask_mode=mask_mode,
                top_k=kernels.top_k,
                build=kernels.build_tree,
                step=kernels.beam_step,
            )
            for s in shapes
            if not s.is_plain
        }
        widest = max(s.topk for s in shapes)
        # a drawing step draws the root's children from its logits: the state keeps them
        draws = draw_drafts and any(not s.is_plain for s in shapes)
        self._draft_token_ids = token_ids = draft.token_ids
        columns = draft.vocab_size if token_ids is None else token_ids.numel()
        self._extender = DraftExtender(
            draft,
            topk=widest,
            use_aux_hidden=use_aux_hidden,
            top_k=kernels.top_k,
            keep_logits=draws,
        )
        self._state = DraftStateStore(
            num_rows=target.req_to_token_pool.size,
            topk=widest,
            hidden_size=draft_hidden_size,
            hidden_dtype=draft.kv_pool.geometry.dtype,
            device=target.req_to_token_pool.req_to_token.device,
            lag_width=lag_width(shapes, mask_mode),
            logits_width=columns if draws else 0,
        )
        super().__init__(
            target,
            shape,
            mask_mode=mask_mode,
            kernels=kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            device_lengths=device_lengths,
            policy=policy,
            draw_drafts=draw_drafts,
        )

    @property
    def _drafter(self) -> TreeDrafter:
        """The default shape's drafter."""
        return self._drafters[self.shape]

    def _draft_and_verify(
        self, shape: DraftShape, window: DecodeWindow, rows: torch.Tensor, sampling: SamplingInputs
    ) -> tuple[DraftTree, Verification]:
        """Draft ``shape``'s tree over the states at ``rows`` (bs,) and verify it: a chain whose
        sampling requests draw their drafts when its verifier says so. Device work only."""
        verifier = self._verifiers[shape]
        draws = None
        if verifier.draws and not sampling.all_greedy:
            coins = sampling.coins(self._kernels.coins, verifier.num_coins)  # (bs, drawing_coins)
            draws = DraftDraws(sampling, coins, self._draft_token_ids, shape, self._kernels)
        state = self._state.gather(rows, shape.topk, logits=draws is not None)
        tree = self._drafters[shape].draft(window, state, draws)
        return tree, verifier.verify(window, tree, sampling, draws)

    def _prefill_draft(
        self,
        batch: ForwardBatch,
        last_rows: torch.Tensor,
        next_tokens: torch.Tensor,
        target_out: ModelOutput,
    ) -> int:
        state = self._extender.extend_prefill(batch, last_rows, next_tokens, target_out)
        self._state.scatter(batch.req_pool_indices, state)
        self._state.lag.clear(batch.req_pool_indices)
        return 1
