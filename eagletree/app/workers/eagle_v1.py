"""EagleWorkerV1: EAGLE tree speculation with host-side bookkeeping — the explicit fallback.

Draft, tree and verify are v2's (``TreeDrafter``, ``TreeVerifier``). Then the host reads the
accepted paths (the step's one deliberate sync) and keeps only what was accepted:

* page_size 1 — ``req_to_token[row, L : L + a]`` is pointed at the accepted nodes' slots (no
  KV is copied; the slots left over, rejected nodes and draft scratch, form the window's tail)
  and the window tail is freed, so a request holds exactly ``L + a + 1`` slots after a step;
* page_size P > 1 — the row is never rewritten, so every position keeps the slot the scheduler
  gave it and pages stay dense: the accepted path's target KV is moved to the window's first
  ``a + 1`` slots (``accepted_move_plan`` → ``move_kv_cache``, k > 1 only) and the window is
  freed past the page that holds the new committed end;
* draft-extend — one EXTEND forward of the draft over each request's ``a + 1`` accepted tokens
  (ragged, lengths known on the host), whose last row proposes the next top-k.

The scheduler grows each window back to ``committed + max(S·k, N)`` before the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.row_slots import free_window_tail
from eagletree.app.engine.transfers import to_device
from eagletree.app.workers.decode_window import DecodeWindow
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.app.workers.tree_worker import TreeWorker
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.compaction import accepted_move_plan, compact_to_front
from eagletree.domain.tree import TreeMaskMode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.app.workers.verifier import Verification
    from eagletree.domain.request import Request
    from eagletree.ports.memory import TokenSlotAllocator
    from eagletree.ports.model import DraftRunner, ModelRunner


class EagleWorkerV1(TreeWorker):
    """Speculative worker that frees rejected slots every step; serves page_size > 1.

    Arguments as ``TreeWorker``'s, plus the ``allocator`` the scheduler hands slots out of
    (v1 gives the rejected ones back itself). The draft must share the target's req_to_token
    pool: the pointer rewrite has to be seen by both. The page size is the target pool's. Its
    decode steps run eagerly, sized on the host (no graph is captured).
    """

    def __init__(
        self,
        target: ModelRunner,
        draft: DraftRunner,
        *,
        allocator: TokenSlotAllocator,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        draft_hidden_size: int,
        use_aux_hidden: bool = False,
        mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kernels: StepKernels = REFERENCE_KERNELS,
        draw_drafts: bool = False,
    ) -> None:
        if draft.req_to_token_pool is not target.req_to_token_pool:
            raise ValueError(
                "EagleWorkerV1 rewrites req_to_token rows: the draft runner must share the "
                "target runner's req_to_token pool"
            )
        super().__init__(
            target,
            draft,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            mask_mode=mask_mode,
            kernels=kernels,
            device_lengths=False,  # the host knows every length after each step
            draw_drafts=draw_drafts,
        )
        self._allocator = allocator
        self.page_size = target.kv_pool.geometry.page_size

    @property
    def reserve_per_step(self) -> int:
        # the draft writes S·k window slots, verify N; the host knows every length in time
        return self.shape.window_len

    @property
    def grow_ahead(self) -> int:
        return 0  # it gives the window's tail back every step

    def _runs_on_device(self, decode: Sequence[Request]) -> bool:
        return False  # it frees rejected slots on the host, from lengths it reads every step

    def _decode_on_host(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.shape.num_draft_tokens
        inputs = self._steps.buffers.fill(requests, len(requests), self._verifier.num_coins)
        window = DecodeWindow.of(inputs)
        tree, verification = self._draft_and_verify(
            self.shape, window, inputs.rows, inputs.sampling
        )
        result = verification.result
        # v1 keeps its books on the host: which slots to keep or free, extend lengths
        accept_index: list[list[int]] = result.accept_index.tolist()  # SYNC: v1's bookkeeping
        accept_length: list[int] = result.accept_length.tolist()  # SYNC: (same readback)
        paths = [row[: a + 1] for row, a in zip(accept_index, accept_length, strict=True)]
        if self.page_size == 1:
            self._point_rows_at_accepted_slots(requests, paths)
        elif self.shape.topk > 1:  # a chain's accepted path already sits at the window's front
            tgt, src = accepted_move_plan(
                result.accept_index, result.accept_length, verification.verify_slots, n
            )
            # pairs overlap only within a request's S+1 pairs: each group moves independently
            groups = result.accept_index.shape[1]
            self._target.kv_pool.move_kv_cache(tgt, src, independent_groups=groups)
        for request, path in zip(requests, paths, strict=True):
            free_window_tail(
                request,
                self._kept_window_end(request, len(path)),
                self._allocator,
                self._target.req_to_token_pool,
            )
        self._state.scatter(inputs.rows, self._extend_accepted(window, verification, paths))
        self.last_tree, self.last_verification = tree, verification
        bs = window.batch_size
        predict = compact_to_front(result.predict, result.accept_index, n)  # (bs·N,)
        tokens = predict.view(bs, n)[:, : self.shape.tokens_per_step].to(torch.int64)
        return tokens, result.accept_length.to(torch.int64) + 1

    def _kept_window_end(self, request: Request, path_len: int) -> int:
        """Columns of the row the request keeps: its new committed end, up to a page end."""
        end = request.committed_len + path_len
        page = self.page_size
        return min(request.allocated_len, -(-end // page) * page)

    def _point_rows_at_accepted_slots(
        self, requests: list[Request], paths: list[list[int]]
    ) -> None:
        """Permute each verify block's columns so the accepted nodes' slots come first.

        Columns ``[L, L + N)`` of request b's row hold node i's slot at ``L + i``; afterwards
        ``L + t`` holds node ``path[t]``'s and the other nodes' slots follow in node order,
        in the tail that ``free_window_tail`` returns. No slot is lost or duplicated.
        """
        n = self.shape.num_draft_tokens
        rows: list[int] = []
        dst: list[int] = []
        src: list[int] = []
        for b, (request, path) in enumerate(zip(requests, paths, strict=True)):
            assert request.row is not None, request
            nodes = [node - b * n for node in path]
            accepted = set(nodes)
            order = nodes + [i for i in range(n) if i not in accepted]
            base = request.committed_len
            rows += [request.row] * n
            dst += [base + i for i in range(n)]
            src += [base + node for node in order]
        if not rows:
            return
        table = self._target.req_to_token_pool.req_to_token
        row_index = to_device(torch.tensor(rows), table.device)
        table[row_index, to_device(torch.tensor(dst), table.device)] = table[
            row_index, to_device(torch.tensor(src), table.device)
        ]  # the right side is gathered before the write

    def _extend_accepted(
        self, window: DecodeWindow, verification: Verification, paths: list[list[int]]
    ) -> DraftInput:
        """Draft EXTEND over the accepted tokens: row t of request b sits at ``L_b + t``, reads
        node ``path[t]``'s predicted token and target features, and writes its draft KV at
        ``req_to_token[row, L_b + t]`` (where the target KV of that position now lives)."""
        device = self._batches.device
        lens = torch.tensor([len(path) for path in paths], dtype=torch.int64)
        nodes = torch.tensor([node for path in paths for node in path], dtype=torch.int64)
        nodes_dev = to_device(nodes, device)
        first = torch.cumsum(lens, 0) - lens
        total = int(lens.sum())
        offsets = torch.arange(total) - torch.repeat_interleave(first, lens)
        assert window.seq_lens_cpu is not None, "v1 builds its windows on the host"
        positions = to_device(torch.repeat_interleave(window.seq_lens_cpu, lens) + offsets, device)
        token_rows = torch.repeat_interleave(
            window.req_pool_indices, to_device(lens, device), output_size=total
        )
        table = self._target.req_to_token_pool.req_to_token
        features = self._extender.target_features(
            verification.hidden_states, verification.aux_hidden_states
        )
        batch = ForwardBatch(
            mode=ForwardMode.EXTEND,
            input_ids=verification.result.predict.index_select(0, nodes_dev).to(torch.int64),
            positions=positions,
            seq_lens=window.seq_lens,
            req_pool_indices=window.req_pool_indices,
            out_cache_loc=table[token_rows, positions].to(torch.int64),
            extend_lens=to_device(lens, device),
            seq_lens_cpu=window.seq_lens_cpu,
            seq_lens_sum=window.seq_lens_sum,
            extend_lens_cpu=lens,
        )
        last_rows = to_device(torch.cumsum(lens, 0) - 1, device)
        return self._extender.extend_ragged(batch, features.index_select(0, nodes_dev), last_rows)
