"""SpeculativeWorker: the step every speculative worker shares, the shape it drafts, its state.

A step prefills the plan's new requests — the target's prefill, each request's first token, the
draft's prefill whose proposals root the request's first tree — then verifies the running ones:
a draft of ``DraftShape`` (S, k, N) per request, one target forward over it, the accepted path
committed, the draft re-extended. The workers differ in how they draft and re-extend (the hooks
``_prefill_draft`` and ``_decode_as``): ``TreeWorker``'s beam for EAGLE v1 / v2
(``tree_worker.py``), a chain of MTP layers for ``MultiLayerEagleWorkerV2``.

Per-request device state between steps lives in a ``DraftStateStore`` (``draft_state``).
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.app.engine.worker import StepOutput, joined_phases
from eagletree.app.workers.sampler import SamplingMode, sample_next_tokens, sampling_mode
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.policy import FixedShape, ShapePolicy
from eagletree.app.workers.shapes.step_costs import measure_step_costs
from eagletree.app.workers.shapes.step_feedback import StepFeedback
from eagletree.app.workers.step_worker import StepWorker
from eagletree.app.workers.verifier import TreeVerifier
from eagletree.domain.draft_shape import PLAIN, DraftShape, reserved_slots
from eagletree.domain.tree import TreeMaskMode

if TYPE_CHECKING:
    from eagletree.app.engine.plan import SchedulePlan
    from eagletree.app.workers.decode_inputs import DecodeInputs
    from eagletree.app.workers.draft_state import DraftStateStore
    from eagletree.app.workers.step_graphs import DecodeStepRunner
    from eagletree.app.workers.step_kernels import StepKernels
    from eagletree.app.workers.verifier import Verification
    from eagletree.domain.batch import ForwardBatch
    from eagletree.domain.model_output import ModelOutput
    from eagletree.domain.request import Request
    from eagletree.domain.tree import DraftTree
    from eagletree.ports.model import ModelRunner


class SpeculativeWorker(StepWorker):
    """A worker that verifies drafts with ``target``: the template ``step``.

    ``policy`` chooses each decode step's shape among its ``shapes`` (the first is the default:
    idle steps); without one every step drafts ``shape``. A subclass sets ``_state`` and
    implements ``_prefill_draft`` and ``_decode_as`` (the device step of one shape, which the
    step runners replay); a worker whose decode step is sized on the host for some batches says
    so in ``_runs_on_device`` and implements ``_decode_on_host``. ``device_lengths``: the committed
    lengths live on the device (a decode step may run ahead of the host); ``last_tree`` /
    ``last_verification`` keep the latest decode step's device results for inspection (tests,
    debugging; a verification's predict and hidden states may be compacted in place, see
    ``Verification``); nothing reads them back on the host. ``draw_drafts``: the sampling
    requests of a drafting step draw their drafts from the draft's distribution and are
    verified by rejection sampling against it (``draft_draws``); greedy ones take the top k as
    ever.
    """

    _state: DraftStateStore

    def __init__(
        self,
        target: ModelRunner,
        shape: DraftShape,
        *,
        mask_mode: TreeMaskMode,
        kernels: StepKernels,
        graph_buckets: Sequence[int] = (),
        use_cuda_graphs: bool = False,
        device_lengths: bool = True,
        policy: ShapePolicy | None = None,
        draw_drafts: bool = False,
    ) -> None:
        self._target = target
        self.policy = FixedShape(shape) if policy is None else policy
        if self.policy.shapes[0] != shape:
            raise ValueError(f"the policy's default shape {self.policy.shapes[0]} is not {shape}")
        self.shape = shape
        self.mask_mode = mask_mode
        self._device_lengths = device_lengths
        self._verifiers = {
            s: TreeVerifier(target, s, kernels=kernels, draws=draw_drafts)
            for s in self.policy.shapes
            if not s.is_plain
        }
        super().__init__(
            target.req_to_token_pool,
            kernels=kernels,
            num_coins=self._coins_per_step(shape),
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            device_lengths=device_lengths,
            decode=partial(self._decode_as, shape),
        )
        self._runners = {shape: self._steps} | {
            s: self._new_step_runner(partial(self._decode_as, s), self._coins_per_step(s))
            for s in self.policy.shapes[1:]
        }
        # a plain step that also extends the draft over every token its rows left in their lag
        self._catch_up = (
            self._new_step_runner(self._decode_catching_up, self._coins_per_step(PLAIN))
            if PLAIN in self.policy.shapes
            else None
        )
        self.last_tree: DraftTree | None = None
        self.last_verification: Verification | None = None
        # the decode steps each shape ran (a catch-up in place of a chosen drafting shape, and
        # every catch-up, counts as plain): what /metrics and the bench report
        self.shape_steps: Counter[DraftShape] = Counter()
        self.last_shape: DraftShape | None = None  # of the latest decode step launched
        self.last_caught_up = False  # whether that step was a catch-up
        self._feedback = StepFeedback(self.policy)

    def _coins_per_step(self, shape: DraftShape) -> int:
        """Coins a sampling request spends in one step of ``shape``: its verifier's (plain
        decoding: the one token's)."""
        return 1 if shape.is_plain else self._verifiers[shape].num_coins

    @property
    def _verifier(self) -> TreeVerifier:
        """The default shape's verifier."""
        return self._verifiers[self.shape]

    def capture_graphs(self, progress: Callable[[str], None] | None = None) -> float:
        """Capture every shape's decode graphs; returns the seconds taken."""
        many = len(self._runners) > 1
        seconds = sum(
            runner.capture(progress, shape.label if many else "")
            for shape, runner in self._runners.items()
        )
        if self._catch_up is not None:
            seconds += self._catch_up.capture(progress, "plain with the draft's catch-up")
        return seconds

    def calibrate(self, progress: Callable[[str], None] | None = None) -> None:
        """An adaptive policy's step costs, measured over every shape's runner."""
        if isinstance(self.policy, AdaptiveShapes):
            buckets = self._buckets or (1,)
            costs = measure_step_costs(
                self._runners,
                buckets,
                catch_up=self._catch_up,  # a run of plain steps: one catch-up every lag width
                catch_up_every=self._state.lag.width,
                progress=progress,
            )
            self.policy.use_costs(costs)

    @property
    def reserve_per_step(self) -> int:
        return reserved_slots(self.policy.shapes)

    def can_run_ahead(self, decode: Sequence[Request]) -> bool:
        # committed lengths live on the device; only FULL_MASK sizes its mask from Σ L_b, and
        # a step sized on the host needs exact host lengths
        return self.mask_mode is TreeMaskMode.QLEN_ONLY and self._runs_on_device(decode)

    @property
    def num_tracked_requests(self) -> int:
        """Requests whose draft state the worker holds (the live ones after a step)."""
        return len(self._state)

    def step(self, plan: SchedulePlan) -> StepOutput:
        """Prefill the plan's new requests, then one verify step over its running ones; the
        rows of the two phases joined in that order. A plan with neither runs an idle verify
        step (bs == 0) through every phase, as a data-parallel rank without requests must; a
        group sharing its dense layers runs the phases it agreed on (``plan.phases``), some
        maybe with zero rows."""
        all_owned = self._state.retain(plan.live)
        self._feedback.launched()
        phases = plan.phases
        outputs: list[StepOutput] = []
        if phases.prefill:
            outputs.append(self._prefill(plan.prefill))
        if phases.decode or not phases.prefill:
            decode = plan.decode
            if not all_owned:
                self._state.check_owned(decode)
            shape = self.policy.choose(decode)
            observed: torch.Tensor | None = None
            lagging = catch_up = drafted_on_device = False
            if self._runs_on_device(decode):
                shape, runner, lagging = self._runner_of(shape, decode)
                catch_up = runner is self._catch_up
                run = runner.run(decode, exact_lengths=plan.exact_lengths)
                tokens, emitted, *rest = run
                observed = rest[0] if rest and not shape.is_plain else None
                drafted_on_device = not shape.is_plain  # its accepted paths are read back
                sampled = runner.last_mode is not SamplingMode.GREEDY
            else:
                assert plan.exact_lengths, "a step sized on the host needs exact host lengths"
                tokens, emitted = self._decode_on_host(decode)
                sampled = sampling_mode(decode) is not SamplingMode.GREEDY
            self._state.ran(decode, lagging=lagging)
            if decode:
                self.shape_steps[shape] += 1
                self.last_shape, self.last_caught_up = shape, catch_up
            # the verify and the draft's forwards (a tree's S − 1 draft steps and its extend;
            # a plain step's catch-up)
            forwards = 1 + (0 if lagging else max(shape.num_steps, 1))
            observer = None
            if decode:
                observer = self._feedback.observer(
                    shape,
                    timed=not phases.prefill,  # a step that also prefilled took longer
                    paths=drafted_on_device,
                    catch_up=catch_up,
                    sampled=sampled,
                )
            outputs.append(
                StepOutput(
                    requests=decode,
                    tokens=tokens,
                    num_emitted=emitted,
                    num_committed=emitted,
                    num_forwards=forwards,
                    num_prefill=0,
                    speculative=True,
                    observed=observed,
                    observer=observer,
                )
            )
        return joined_phases(outputs, len(plan.prefill), speculative=True)

    def untimed_steps(self) -> contextlib.AbstractContextManager[None]:
        """Steps launched inside teach the policy what they accepted, not what they cost
        (``StepFeedback.untimed``)."""
        return self._feedback.untimed()

    def _prefill(self, requests: list[Request]) -> StepOutput:
        """Target prefill, each request's first token, and the draft prefill whose proposals
        root the request's first tree: one emitted token, the whole fill committed."""
        batch, last_rows = self._batches.extend(requests)
        out = self._target.forward(batch, last_rows)
        next_tokens = sample_next_tokens(out.logits, requests, self._kernels).to(torch.int64)
        num_draft_forwards = self._prefill_draft(batch, last_rows, next_tokens, out)
        self._state.own(requests)
        if self._device_lengths:
            self._steps.buffers.set_lengths(requests)
        committed = torch.tensor([r.num_tokens - r.committed_len for r in requests])
        return StepOutput(
            requests=requests,
            tokens=next_tokens.unsqueeze(1),
            num_emitted=torch.ones_like(next_tokens),
            num_committed=to_device(committed, next_tokens.device),
            num_forwards=1 + num_draft_forwards,
            num_prefill=len(requests),
        )

    @abstractmethod
    def _prefill_draft(
        self,
        batch: ForwardBatch,
        last_rows: torch.Tensor,
        next_tokens: torch.Tensor,
        target_out: ModelOutput,
    ) -> int:
        """The draft's prefill after the target's EXTEND ``batch`` (``last_rows`` (bs,) each
        request's last row, ``next_tokens`` (bs,) int64 the target's first tokens): store each
        request's state at its row; returns the draft forwards it ran. Device work only."""

    def _decode_as(self, shape: DraftShape, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """One decode step of ``shape`` over ``inputs`` → tokens (bs, S + 1) int64 (the first
        ``emitted`` of each row are the step's tokens), emitted (bs,) int64 and, when the
        policy observes and the shape is a tree, the accepted paths' ranks and offers (bs, 2·S)
        int64 (a chain's follow from emitted). Device work only."""
        raise NotImplementedError(f"{type(self).__name__} decodes on the host only")

    def _runner_of(
        self, shape: DraftShape, decode: Sequence[Request]
    ) -> tuple[DraftShape, DecodeStepRunner, bool]:
        """The step to run when the policy chose ``shape``: the shape it runs, its runner and
        whether it leaves one more token in the rows' draft lag. A plain step leaves its token
        there until some row's lag would fill; then, and before a step that drafts while some
        row lags, it runs the catch-up (the drafting shape waits one step)."""
        if self._catch_up is None:
            return shape, self._runners[shape], False
        lag = self._state.lag_bound if decode else 0
        if shape.is_plain and lag + 1 < self._state.lag.width:
            return shape, self._runners[shape], True
        if shape.is_plain or lag:
            return PLAIN, self._catch_up, False
        return shape, self._runners[shape], False

    def _decode_catching_up(self, inputs: DecodeInputs) -> tuple[torch.Tensor, ...]:
        """A plain step whose draft then extends over every token in its rows' lag (as
        ``_decode_as``'s outputs). Device work only."""
        raise NotImplementedError(f"{type(self).__name__} has no plain steps")

    def _runs_on_device(self, decode: Sequence[Request]) -> bool:
        """Whether the decode step over ``decode`` is ``_decode_as`` (run by the step
        runner, from a graph where one is captured) rather than ``_decode_on_host``."""
        return True

    def _decode_on_host(self, decode: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode step sized from the requests' exact host lengths → (tokens, emitted),
        as ``_decode_as``'s."""
        raise NotImplementedError(f"{type(self).__name__} decodes on the device only")
