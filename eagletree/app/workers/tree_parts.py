"""The pieces every EAGLE tree worker is built from, assembled once (v1 and v2 share them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from eagletree.app.forward_batches import BatchBuilder
from eagletree.app.workers.draft_extender import DraftExtender
from eagletree.app.workers.draft_state import DraftStateStore
from eagletree.app.workers.tree_drafter import TreeDrafter
from eagletree.app.workers.verifier import TreeVerifier

if TYPE_CHECKING:
    from eagletree.domain.tree import TreeMaskMode
    from eagletree.ports.model import DraftRunner, ModelRunner


class TreeParts(NamedTuple):
    """Batch builder, drafter, verifier, draft-extender and per-request draft state."""

    batches: BatchBuilder
    drafter: TreeDrafter
    verifier: TreeVerifier
    extender: DraftExtender
    state: DraftStateStore


def build_tree_parts(
    target: ModelRunner,
    draft: DraftRunner,
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    draft_hidden_size: int,
    use_aux_hidden: bool,
    mask_mode: TreeMaskMode,
) -> TreeParts:
    """The parts of a tree worker over ``target`` and ``draft`` for one (S, k, N)."""
    batches = BatchBuilder(target.req_to_token_pool)
    return TreeParts(
        batches=batches,
        drafter=TreeDrafter(
            draft,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            mask_mode=mask_mode,
        ),
        verifier=TreeVerifier(target, num_steps=num_steps, num_draft_tokens=num_draft_tokens),
        extender=DraftExtender(draft, topk=topk, use_aux_hidden=use_aux_hidden),
        state=DraftStateStore(
            num_rows=target.req_to_token_pool.size,
            topk=topk,
            hidden_size=draft_hidden_size,
            hidden_dtype=draft.kv_pool.dtype,
            device=batches.device,
        ),
    )
