"""The pieces every EAGLE tree worker is built from, assembled once (v1 and v2 share them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from eagletree.app.engine.worker import StepOutput
from eagletree.app.workers.draft_extender import DraftExtender
from eagletree.app.workers.draft_state import DraftStateStore
from eagletree.app.workers.forward_batches import BatchBuilder
from eagletree.app.workers.sampler import sample_next_tokens
from eagletree.app.workers.step import prefill_output
from eagletree.app.workers.tree_drafter import TreeDrafter
from eagletree.app.workers.verifier import TreeVerifier

if TYPE_CHECKING:
    from eagletree.app.workers.step_kernels import StepKernels
    from eagletree.domain.request import Request
    from eagletree.domain.tree import TreeMaskMode
    from eagletree.ports.model import DraftRunner, ModelRunner


class TreeParts(NamedTuple):
    """Batch builder, drafter, verifier, draft-extender, per-request draft state, kernels."""

    batches: BatchBuilder
    drafter: TreeDrafter
    verifier: TreeVerifier
    extender: DraftExtender
    state: DraftStateStore
    kernels: StepKernels


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
    kernels: StepKernels,
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
            top_k=kernels.top_k,
            build=kernels.build_tree,
            step=kernels.beam_step,
        ),
        verifier=TreeVerifier(
            target, num_steps=num_steps, num_draft_tokens=num_draft_tokens, kernels=kernels
        ),
        extender=DraftExtender(
            draft, topk=topk, use_aux_hidden=use_aux_hidden, top_k=kernels.top_k
        ),
        state=DraftStateStore(
            num_rows=target.req_to_token_pool.size,
            topk=topk,
            hidden_size=draft_hidden_size,
            hidden_dtype=draft.kv_pool.geometry.dtype,
            device=batches.device,
        ),
        kernels=kernels,
    )


def prefill_tree_requests(
    parts: TreeParts, target: ModelRunner, requests: list[Request], tokens_per_step: int
) -> StepOutput:
    """Target prefill, the first token of each request, and the draft prefill whose top-k is
    the root of the request's first tree (the same for every EAGLE tree worker)."""
    batch, last_rows = parts.batches.extend(requests)
    out = target.forward(batch, last_rows)
    next_tokens = sample_next_tokens(out.logits, requests, parts.kernels)  # (bs,) int64
    parts.state.scatter(requests, parts.extender.extend_prefill(batch, last_rows, next_tokens, out))
    return prefill_output(requests, next_tokens, tokens_per_step, num_forwards=2)
