"""The multi-layer MTP worker's draft chain: MTP layer 0..S−1 over one extend, and its verify tree.

Layer i's row at position p reads the token at ``p + i + 1`` with layer ``i − 1``'s output
hidden state at p (layer 0: the target's). So layer i + 1 runs over the same rows as layer i
with the tokens shifted one place left, the token layer i just proposed put after each
request's last row; each request's bonus row yields draft i + 1 in layer i. Layer i runs
runner i, over that runner's own KV pool, req_to_token pool and attention backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from eagletree.app.workers.draft_extender import shift_left

if TYPE_CHECKING:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.app.workers.step_kernels import StepKernels
    from eagletree.domain.batch import ForwardBatch
    from eagletree.domain.tree import DraftTree, TreeMaskMode
    from eagletree.ports.memory import ReqToTokenPool
    from eagletree.ports.model import DraftRunner


class MtpLayerChain:
    """Runs ``drafts[i]`` as draft step i (topk 1) and builds the chain's verify tree.

    ``target_pool`` is the target's (the scheduler's) req_to_token pool: a runner owning a pool
    of its own gets the step's rows copied into it before it runs. Free of host sync.
    """

    def __init__(
        self,
        drafts: Sequence[DraftRunner],
        target_pool: ReqToTokenPool,
        *,
        num_draft_tokens: int,
        mask_mode: TreeMaskMode,
        kernels: StepKernels,
    ) -> None:
        self._drafts = list(drafts)
        self._target_pool = target_pool
        self._kernels = kernels
        self.num_steps = len(self._drafts)
        self.num_draft_tokens = num_draft_tokens
        self.mask_mode = mask_mode

    def extend(
        self,
        batch: ForwardBatch,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        last_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i over the batch's rows, i = 0..S−1 → drafts (bs, S) int64, probs (bs, S).

        ``tokens`` (num_tokens,) layer 0's inputs (the token after each row's position);
        ``hidden`` (num_tokens, H) the target's hidden states; ``last_rows`` (bs,) each
        request's bonus row, whose logits give the drafts.
        """
        drafts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for i, runner in enumerate(self._drafts):
            self._mirror_rows(runner, batch.req_pool_indices)
            out = runner.forward(dataclasses.replace(batch, input_ids=tokens), hidden, last_rows)
            # (bs, 1) each, target ids
            top_p, top_token = self._kernels.top_k(out.logits, 1, out.token_ids)
            p, token = top_p[:, 0], top_token[:, 0]
            drafts.append(token)
            probs.append(p)
            if i + 1 < len(self._drafts):
                tokens = shift_left(tokens, last_rows, token)
                hidden = out.hidden_states
        return torch.stack(drafts, dim=1), torch.stack(probs, dim=1)

    def verify_tree(self, window: DecodeWindow, state: DraftInput) -> DraftTree:
        """The verify tree of each request: the bonus token, then its S drafts as a chain."""
        bs, num_steps = window.batch_size, self.num_steps
        device = window.seq_lens.device
        chain = torch.arange(num_steps, dtype=torch.int64, device=device).expand(bs, num_steps)
        return self._kernels.build_tree(
            state.bonus_tokens,
            torch.zeros((bs, 0), dtype=torch.int64, device=device),  # unused for a chain
            chain,
            state.topk_index,
            window.seq_lens,
            1,
            num_steps,
            self.num_draft_tokens,
            self.mask_mode,
            seq_lens_sum=window.seq_lens_sum,
        )

    def _mirror_rows(self, runner: DraftRunner, rows: torch.Tensor) -> None:
        """Copy the step's req_to_token rows into a runner that owns a table of its own."""
        own = runner.req_to_token_pool.req_to_token
        shared = self._target_pool.req_to_token
        if own is not shared:
            own[rows] = shared[rows]
