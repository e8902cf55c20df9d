"""MultiLayerEagleWorkerV2: chain speculation with one DraftRunner per MTP layer, no host sync.

MTP layer i predicts the token ``i + 2`` places ahead: its row at position p reads the token at
``p + i + 1`` with layer ``i − 1``'s output hidden state at p (layer 0: the target's). So a
chain of S drafts needs no draft forward before verify: the draft-extend after each verify runs
layer 0, 1, …, S−1 over the same rows, each shifting the tokens one place left and putting the
token the previous layer just proposed after the request's last true token; the row of the
bonus token yields draft i + 1 in layer i. Step i always runs runner i, over runner i's own KV
pool, req_to_token pool and attention backend (upstream bug PR #22954: every step used the
first runner's token pool).

Boundary rows: at the end of a draft-extend, layer i's last i rows read drafted tokens, not
true ones. Upstream keeps that KV. Here every draft-extend starts ``min(S − 1, L)`` rows before
the committed length L, recomputing those rows from tokens the target has since confirmed (the
target hidden states of the last S − 1 committed positions are kept per request for this), so
every layer's committed KV equals what that layer computes over the true sequence.

One decode step: chain tree (root = bonus, node i = draft i) → TARGET_VERIFY (``TreeVerifier``)
→ draft-extend over ``S − 1 + N`` rows per request from ``L − S + 1`` (DRAFT_EXTEND, fixed width,
N = S + 1), which is one device function a CUDA graph can replay; a step in which a request has
fewer than S − 1 committed tokens extends ``min(S − 1, L) + N`` rows instead, sized on the host
(``mtp_extend``). No compaction: a chain's accepted path is already at the front of its block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eagletree.app.forward_batches import BatchBuilder, to_device
from eagletree.app.sampler import sample_next_tokens, sampling_inputs
from eagletree.app.workers.decode_inputs import DecodeInputBuffers, DecodeInputs
from eagletree.app.workers.draft_extender import shift_left
from eagletree.app.workers.draft_state import DecodeWindow, DraftInput, DraftStateStore
from eagletree.app.workers.mtp_extend import ragged_extend_batch
from eagletree.app.workers.step import StepOutput, speculative_step
from eagletree.app.workers.step_graphs import DecodeStepRunner
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.app.workers.verifier import TreeVerifier, Verification
from eagletree.domain.batch import DraftExtendSpec, ForwardBatch, ForwardMode
from eagletree.domain.tree import DraftTree, TreeMaskMode

if TYPE_CHECKING:
    from eagletree.app.scheduler import SchedulePlan
    from eagletree.domain.request import Request
    from eagletree.ports.model import DraftRunner, ModelRunner


class MultiLayerEagleWorkerV2:
    """Speculative worker over S MTP layers (``drafts[i]`` runs draft step i), topk 1.

    Arguments as ``EagleWorkerV2``'s with one runner per MTP layer; ``num_draft_tokens`` must
    be ``num_steps + 1`` and ``drafts`` must hold at least ``num_steps`` runners. A runner may
    own a req_to_token pool of its own: the rows of a step's requests are copied into it from
    the target's (the scheduler's) before that runner runs.

    Per request the worker keeps, in a ``DraftStateStore`` indexed by req_to_token row, the
    pending bonus token, the S chain drafts (``topk_index`` (S,)) with their draft
    probabilities (``topk_p``), and as ``hidden_states`` the target hidden states of the last
    S − 1 committed positions, oldest first, flattened to ((S − 1)·H,).
    """

    def __init__(
        self,
        target: ModelRunner,
        drafts: Sequence[DraftRunner],
        *,
        num_steps: int,
        topk: int = 1,
        num_draft_tokens: int,
        draft_hidden_size: int,
        use_aux_hidden: bool = False,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kernels: StepKernels = REFERENCE_KERNELS,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
    ) -> None:
        hidden = target.hidden_size
        problems = []
        if topk != 1 or num_draft_tokens != num_steps + 1:
            problems.append(
                f"it drafts a chain: topk must be 1 and num_draft_tokens num_steps + 1 "
                f"(got topk={topk}, num_steps={num_steps}, num_draft_tokens={num_draft_tokens})"
            )
        if not 1 <= num_steps <= len(drafts):
            problems.append(f"num_steps={num_steps} needs 1..{len(drafts)} MTP layer runners")
        if use_aux_hidden or draft_hidden_size != hidden:
            problems.append(
                f"MTP layers read the target's final hidden states (width {hidden}); got "
                f"draft_hidden_size={draft_hidden_size}, use_aux_hidden={use_aux_hidden}"
            )
        if problems:
            raise ValueError("MultiLayerEagleWorkerV2: " + "; ".join(problems))
        self._target = target
        self._drafts = list(drafts[:num_steps])
        self.num_steps = num_steps
        self.topk = 1
        self.num_draft_tokens = num_draft_tokens
        self.mask_mode = mask_mode
        self._batches = BatchBuilder(target.req_to_token_pool)
        self._kernels = kernels
        self._verifier = TreeVerifier(
            target, num_steps=num_steps, num_draft_tokens=num_draft_tokens, kernels=kernels
        )
        self._state = DraftStateStore(
            num_rows=target.req_to_token_pool.size,
            topk=num_steps,
            hidden_size=(num_steps - 1) * hidden,
            hidden_dtype=self._drafts[0].kv_pool.dtype,
            device=self._batches.device,
        )
        self._steps = DecodeStepRunner(
            self._decode_on_device,
            DecodeInputBuffers.for_pool(
                target.req_to_token_pool, padded=bool(graph_buckets), device_lengths=True
            ),
            num_coins=self._verifier.num_coins,
            buckets=graph_buckets,
            use_graphs=use_cuda_graphs,
        )
        # (rows, S − 1) int64: the tokens after each row's last S − 1 committed positions
        self._front = torch.zeros(
            target.req_to_token_pool.size,
            num_steps - 1,
            dtype=torch.int64,
            device=self._batches.device,
        )
        self.last_tree: DraftTree | None = None
        self.last_verification: Verification | None = None

    @property
    def step_runner(self) -> DecodeStepRunner:
        return self._steps

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        """Capture the decode step's CUDA graph of every bucket; returns the seconds taken."""
        return self._steps.capture(progress)

    @property
    def reserve_per_step(self) -> int:
        # verify writes N window slots; twice that lets the host learn lengths one step late
        return 2 * self.num_draft_tokens

    @property
    def tokens_per_step(self) -> int:
        return self.num_draft_tokens

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        # a lower bound of S − 1 committed tokens is enough for the fixed-width device step;
        # a shorter request takes the ragged step, which is sized from exact host lengths
        return all(r.committed_len >= self.num_steps - 1 for r in decode)

    @property
    def num_tracked_requests(self) -> int:
        return len(self._state)

    def step(self, plan: SchedulePlan) -> StepOutput:
        """Prefill the plan's new requests, verify the running ones' chains (an idle step,
        bs == 0, through every phase when the plan has neither)."""
        self._state.retain(plan.live)
        exact = plan.exact_lengths
        return speculative_step(
            plan, self._prefill, lambda requests: self._decode(requests, exact_lengths=exact)
        )

    # -- prefill ---------------------------------------------------------------------------------

    def _prefill(self, requests: list[Request]) -> StepOutput:
        batch, last_rows = self._batches.extend(requests)
        out = self._target.forward(batch, last_rows)
        next_tokens = sample_next_tokens(out.logits, requests, self._kernels).to(torch.int64)
        tokens = shift_left(batch.input_ids, last_rows, next_tokens)
        drafts, probs = self._run_chain(batch, tokens, out.hidden_states, last_rows)
        next_state = self._next_state(next_tokens, drafts, probs, out.hidden_states, last_rows)
        self._state.scatter(requests, next_state)
        self._steps.buffers.set_lengths(requests)
        self._store_front(batch.req_pool_indices, tokens, last_rows)
        committed = torch.tensor([r.num_tokens - r.committed_len for r in requests])
        return StepOutput(
            requests=requests,
            tokens=F.pad(next_tokens.unsqueeze(1), (0, self.tokens_per_step - 1)),
            num_emitted=torch.ones_like(next_tokens),
            num_committed=to_device(committed, next_tokens.device),
            num_forwards=1 + self.num_steps,
            num_prefill=len(requests),
        )

    # -- decode ----------------------------------------------------------------------------------

    def _decode(self, requests: list[Request], *, exact_lengths: bool = True) -> StepOutput:
        self._state.check_owned(requests)
        if self.can_run_ahead(requests):  # every request: S − 1 + N rows
            tokens, emitted = self._steps.run(requests, exact_lengths=exact_lengths)
        else:
            assert exact_lengths, "a ragged step is sized from exact host lengths"
            tokens, emitted = self._decode_ragged(requests)
        self._state.own(requests)
        return StepOutput(
            requests=requests,
            tokens=tokens,
            num_emitted=emitted,
            num_committed=emitted,
            num_forwards=1 + self.num_steps,
            num_prefill=0,
        )

    def _decode_on_device(self, inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Verify, then layer 0..S−1 over a fixed ``S − 1 + N`` rows per request (DRAFT_EXTEND
        from ``L − S + 1``; the S − 1 front rows' tokens are kept per row on the device) →
        tokens (bs, N) int64, emitted (bs,) int64. Device work only."""
        keep, n = self.num_steps - 1, self.num_draft_tokens
        width = keep + n
        window = DecodeWindow(
            inputs.rows, inputs.seq_lens, inputs.seq_lens_cpu, inputs.seq_lens_sum
        )
        state = self._state.gather_rows(inputs.rows)
        tree = self._chain_tree(window, state)
        verification = self._verifier.verify(window, tree, inputs.sampling)
        result = verification.result
        bs = window.batch_size
        predict = result.predict.to(torch.int64).view(bs, n)
        # rows: the S − 1 kept positions, then the N verify nodes; past a path: unused
        front = self._front[inputs.rows]  # (bs, S − 1)
        tokens = torch.cat([front, predict.clamp(min=0)], dim=1).reshape(bs * width)
        h = self._target.hidden_size
        kept = state.hidden_states.view(bs, keep, h)
        verify_hidden = verification.hidden_states.view(bs, n, h).to(kept.dtype)
        hidden = torch.cat([kept, verify_hidden], dim=1).reshape(bs * width, h)
        # padding rows have no committed tokens: clamp keeps their positions at 0..width − 1
        start = (window.seq_lens - keep).clamp(min=0)  # (bs,)
        positions = start.unsqueeze(1) + torch.arange(width, device=start.device)
        table = self._target.req_to_token_pool.req_to_token
        start_cpu = None if window.seq_lens_cpu is None else window.seq_lens_cpu - keep
        batch = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND,
            input_ids=tokens,
            positions=positions.reshape(bs * width),
            seq_lens=start,
            req_pool_indices=inputs.rows,
            out_cache_loc=table[inputs.rows.unsqueeze(1), positions].reshape(-1).to(torch.int64),
            seq_lens_cpu=start_cpu,
            seq_lens_sum=None if start_cpu is None else int(start_cpu.sum()),
            spec=DraftExtendSpec(num_tokens_per_request=width),
        )
        block_start = torch.arange(bs, dtype=torch.int64, device=start.device) * width
        last_rows = block_start + keep + result.accept_length.to(torch.int64)
        drafts, probs = self._run_chain(batch, tokens, hidden, last_rows)
        bonus = tokens.index_select(0, last_rows)
        next_state = self._next_state(bonus, drafts, probs, hidden, last_rows)
        self._state.scatter_rows(inputs.rows, next_state)
        self._store_front(inputs.rows, tokens, last_rows)
        accepted = result.accept_length.to(torch.int64) + 1  # (bs,) tokens committed
        self._steps.buffers.advance_lengths(inputs.rows, window.seq_lens + accepted)
        self.last_tree, self.last_verification = tree, verification
        return predict, accepted

    def _decode_ragged(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """The step when a request has fewer than S − 1 committed tokens (eager, host-sized)."""
        device = self._batches.device
        window = DecodeWindow.of(requests, device)
        state = self._state.gather_rows(window.req_pool_indices)
        tree = self._chain_tree(window, state)
        sampling = sampling_inputs(requests, self._verifier.num_coins, device)
        verification = self._verifier.verify(window, tree, sampling)
        result = verification.result
        batch, hidden, last_rows = ragged_extend_batch(
            requests,
            window,
            state,
            verification,
            self._target.req_to_token_pool.req_to_token,
            num_steps=self.num_steps,
            num_draft_tokens=self.num_draft_tokens,
            hidden_size=self._target.hidden_size,
        )
        drafts, probs = self._run_chain(batch, batch.input_ids, hidden, last_rows)
        bonus = batch.input_ids.index_select(0, last_rows)
        next_state = self._next_state(bonus, drafts, probs, hidden, last_rows)
        self._state.scatter_rows(window.req_pool_indices, next_state)
        self._store_front(window.req_pool_indices, batch.input_ids, last_rows)
        accepted = result.accept_length.to(torch.int64) + 1  # (bs,) tokens committed
        self._steps.buffers.advance_lengths(window.req_pool_indices, window.seq_lens + accepted)
        self.last_tree, self.last_verification = tree, verification
        bs, n = window.batch_size, self.num_draft_tokens
        return result.predict.view(bs, n).to(torch.int64), accepted

    def _store_front(
        self, rows: torch.Tensor, tokens: torch.Tensor, last_rows: torch.Tensor
    ) -> None:
        """Keep, per request, the tokens of the S − 1 batch rows ending at its bonus row
        ``last_rows`` (bs,): the next step's front rows. ``tokens`` (num_tokens,) holds the
        token after each row's position. Rows before a request's first one belong to another
        request; they are read only while the request is shorter than S − 1 tokens, when the
        ragged step builds its front rows on the host instead."""
        keep = self.num_steps - 1
        back = torch.arange(keep - 1, -1, -1, device=last_rows.device)
        index = (last_rows.unsqueeze(1) - back).clamp(min=0)  # (bs, S − 1), oldest first
        self._front[rows] = tokens.to(torch.int64)[index]

    def _chain_tree(self, window: DecodeWindow, state: DraftInput) -> DraftTree:
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

    # -- the layer chain -------------------------------------------------------------------------

    def _run_chain(
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
            top_p, top_token = self._kernels.top_k(out.logits, 1)  # (bs, 1) each
            p, token = top_p[:, 0], top_token[:, 0]
            drafts.append(token)
            probs.append(p)
            if i + 1 < len(self._drafts):
                tokens = shift_left(tokens, last_rows, token)
                hidden = out.hidden_states
        return torch.stack(drafts, dim=1), torch.stack(probs, dim=1)

    def _mirror_rows(self, runner: DraftRunner, rows: torch.Tensor) -> None:
        """Copy the step's req_to_token rows into a runner that owns a table of its own."""
        own = runner.req_to_token_pool.req_to_token
        shared = self._target.req_to_token_pool.req_to_token
        if own is not shared:
            own[rows] = shared[rows]

    def _next_state(
        self,
        bonus: torch.Tensor,
        drafts: torch.Tensor,
        probs: torch.Tensor,
        target_hidden: torch.Tensor,
        last_rows: torch.Tensor,
    ) -> DraftInput:
        """The state after an extend whose rows ``last_rows`` (bs,) sit at each request's last
        committed position; keeps the target hidden states of it and the S − 2 rows before."""
        bs, keep = bonus.shape[0], self.num_steps - 1
        back = torch.arange(keep - 1, -1, -1, device=last_rows.device)
        # rows before a short request's first position hold another request's data: never read
        rows = (last_rows.unsqueeze(1) - back).clamp(min=0)  # (bs, S − 1), oldest first
        kept = target_hidden.index_select(0, rows.reshape(-1))
        return DraftInput(
            bonus_tokens=bonus,
            topk_p=probs,
            topk_index=drafts,
            hidden_states=kept.reshape(bs, keep * self._target.hidden_size),
        )
