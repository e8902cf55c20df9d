"""`eagletree bench` measurement on a scripted engine: prefill excluded, tokens/step, cleanup."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import pytest
import torch
from torch._C._autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from eagletree.app.bench.measure import (
    DecodeMeasurement,
    measure_decode,
    token_budget,
)
from eagletree.app.bench.profiling import (
    PROFILE_WARMUP_STEPS,
    count_launches,
    launched_in_window,
    top_kernels,
)
from eagletree.app.bench.windows import turn_order
from eagletree.app.engine.loop import Engine
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams


@dataclass
class _Stats:
    num_retracted: int = 0


OPS_PER_DECODE_STEP = 2  # aten::ones and aten::add_, which ScriptedEngine.step runs


class _TimingWorker:
    """A worker that knows whether its steps are timed (``untimed_steps``)."""

    def __init__(self) -> None:
        self.timing = True

    @contextlib.contextmanager
    def untimed_steps(self) -> Iterator[None]:
        self.timing = False
        try:
            yield
        finally:
            self.timing = True


class ScriptedEngine:
    """Prefills one request per step; then every running request emits ``accept`` tokens per
    step, recorded as a speculative step when ``speculative``. Counts the steps it ran, and
    those its worker did not time."""

    def __init__(
        self,
        accept: int,
        speculative: bool,
        finish_after: int | None = None,
        overlap: bool = False,
    ) -> None:
        self.accept = accept
        self.overlap = overlap
        self.speculative = speculative
        self.finish_after = finish_after  # decode steps after which request 0 ends (EOS)
        self.requests: list[Request] = []
        self.stats = _Stats()
        self.num_steps = 0
        self.num_decode_steps = 0
        self.worker = _TimingWorker()
        self.untimed = 0

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        request = Request(len(self.requests), prompt_ids, params, max_context_len=1 << 20)
        self.requests.append(request)
        return request

    def step(self) -> list[Request]:
        self.num_steps += 1
        self.untimed += not self.worker.timing
        waiting = [r for r in self.requests if r.status is RequestStatus.WAITING]
        if waiting:  # one prefill per step: the others wait, as a tight prefill budget makes them
            waiting[0].status = RequestStatus.RUNNING
            waiting[0].committed_len = len(waiting[0].prompt_ids)
            waiting[0].output_ids.append(0)
            return []
        self.num_decode_steps += 1
        torch.ones(1).add_(self.num_decode_steps)  # OPS_PER_DECODE_STEP top-level aten ops
        for request in self.requests:
            if request.status is RequestStatus.RUNNING:
                request.output_ids.extend([1] * self.accept)
                if self.speculative:
                    request.emitted_per_step.append(self.accept)
        if self.finish_after == self.num_decode_steps:
            self.requests[0].status = RequestStatus.FINISHED
            self.requests[0].finish_reason = FinishReason.EOS
        return []

    def abort(self, request_id: int) -> bool:
        request = self.requests[request_id]
        request.status = RequestStatus.FINISHED
        request.finish_reason = request.finish_reason or FinishReason.ABORT
        return True

    def has_work(self) -> bool:
        return any(r.status is not RequestStatus.FINISHED for r in self.requests)


def measure(
    engine: ScriptedEngine, bs: int, new_tokens: int, progress: list[int]
) -> DecodeMeasurement:
    return measure_decode(
        cast(Engine, engine),
        [[5, 6, 7]] * bs,
        new_tokens=new_tokens,
        max_tokens_per_step=4,
        warmup_steps=2,
        profile_steps=1,
        cuda=False,
        on_tokens=progress.append,
    )


@pytest.mark.parametrize(("accept", "speculative"), [(1, False), (3, True)])
def test_only_steady_decode_steps_are_timed_and_tokens_per_step_is_the_acceptance(
    accept: int, speculative: bool
) -> None:
    engine = ScriptedEngine(accept, speculative)
    progress: list[int] = []
    m = measure(engine, 3, 7, progress)
    timed_steps = -(-7 // accept)  # enough steps for 7 tokens per request
    assert m.batch_size == 3 and m.num_steps == timed_steps
    assert m.num_tokens == 3 * accept * timed_steps
    assert m.tokens_per_step == accept
    assert progress == [accept * (i + 1) for i in range(timed_steps)]
    assert m.seconds > 0 and m.tokens_per_s == pytest.approx(m.num_tokens / m.seconds)
    # one wall time per timed step, together the window (less its last check and sync)
    assert len(m.step_seconds) == m.num_steps and min(m.step_seconds) > 0
    assert sum(m.step_seconds) <= m.seconds
    # and the tokens each one committed, all requests together
    assert m.step_tokens == (3 * accept,) * timed_steps
    # 3 prefill steps, 2 warm-up, the timed ones, the profiler's unrecorded one and 1 profiled;
    # everything aborted afterwards
    assert engine.num_steps == 3 + 2 + timed_steps + PROFILE_WARMUP_STEPS + 1
    # the profiled steps teach an adaptive worker no step's cost; the measured ones do
    assert engine.untimed == PROFILE_WARMUP_STEPS + 1
    assert m.profile is not None and m.profile.num_steps == 1
    assert m.profile.launches_per_step == OPS_PER_DECODE_STEP  # the unrecorded step is not in it
    assert m.profile.device_ms_per_step is None  # no device on the CPU
    assert not engine.has_work()
    budget = token_budget(7, 2, 1, 4)
    assert all(r.params.max_new_tokens == budget for r in engine.requests)


@pytest.mark.parametrize("overlap", [False, True])
def test_each_timed_step_is_named_after_the_step_whose_tokens_it_read_back(
    overlap: bool,
) -> None:
    # the scripted engine's decode steps launch shapes "s1", "s2", ...; with overlap a step
    # returns the previous one's tokens, so its interval is named after that one
    engine = ScriptedEngine(1, True, overlap=overlap)
    m = measure_decode(
        cast(Engine, engine),
        [[5, 6, 7]] * 2,
        new_tokens=4,
        max_tokens_per_step=4,
        warmup_steps=2,
        profile_steps=0,
        cuda=False,
        launched=lambda: f"s{engine.num_decode_steps}",
    )
    timed = [f"s{2 + i}" for i in range(1, m.num_steps + 1)]  # after 2 warm-up steps
    assert m.num_steps == 4
    assert list(m.step_shapes) == (["s2", *timed[:-1]] if overlap else timed)


def test_a_request_that_ends_inside_the_window_is_accounted_for_not_fatal() -> None:
    engine = ScriptedEngine(1, False, finish_after=4)
    progress: list[int] = []
    m = measure(engine, 2, 8, progress)
    assert (m.num_ended_early, m.ended_early_reason) == (1, "eos")
    # the window waits for the request still running, and counts the ended one's tokens too
    assert m.num_steps == 8 and progress[-1] == 8
    assert m.num_tokens == 2 + 8  # it ended after two of the timed steps (and two warm-ups)
    assert m.profile is not None  # one request was left to profile
    assert not engine.has_work()  # the other request was aborted all the same


def test_when_every_request_ends_early_the_window_ends_and_nothing_is_profiled() -> None:
    engine = ScriptedEngine(1, False, finish_after=5)  # 2 warm-up steps, then 3 timed
    m = measure(engine, 1, 8, [])
    assert (m.num_ended_early, m.num_steps, m.num_tokens, m.profile) == (1, 3, 3, None)


def test_the_budget_outlasts_the_window_however_far_a_request_runs_ahead() -> None:
    # the slowest request gets one token a step, so the window is at most new_tokens steps;
    # a request emitting the most every step through warm-up, window and profile stays in it
    new_tokens, warmup, profile, most = 48, 2, 3, 6
    steps = warmup + new_tokens + 1 + profile + 1  # one more with overlap, one unrecorded
    assert token_budget(new_tokens, warmup, profile, most) >= steps * most


def _event(
    name: str,
    start_us: float,
    end_us: float,
    device: DeviceType = DeviceType.CPU,
    activity: str | None = None,
    parent: FunctionEvent | None = None,
    correlation: int = 0,
) -> FunctionEvent:
    event = FunctionEvent(  # type: ignore[no-untyped-call]  # torch leaves it untyped
        id=correlation,
        name=name,
        thread=0,
        start_us=start_us,
        end_us=end_us,
        device_type=device,
        activity_type=activity,
        is_user_annotation=activity == "gpu_user_annotation",
    )
    if parent is not None:
        event.set_cpu_parent(parent)  # type: ignore[no-untyped-call]
    return event


def test_launches_are_device_activities_on_cuda_and_top_level_aten_ops_on_the_cpu() -> None:
    linear = _event("aten::linear", 0, 10)
    events = [
        linear,
        _event("aten::addmm", 1, 9, parent=linear),  # inside aten::linear: not dispatched anew
        _event("aten::softmax", 10, 12),
        _event("EagleWorkerV2.step", 0, 20),  # a Python range, not an operator
        _event("gemm_kernel", 2, 6, DeviceType.CUDA, "kernel"),
        _event("Memcpy HtoD", 6, 6.5, DeviceType.CUDA, "gpu_memcpy"),
        _event("step", 0, 20, DeviceType.CUDA, "gpu_user_annotation"),  # spans the kernels
    ]
    launches, device_ms = count_launches(events, cuda=True)
    assert launches == 2 and device_ms == pytest.approx(4.5 / 1000)
    assert count_launches(events, cuda=False) == (2, None)


def test_the_costliest_kernels_are_grouped_by_name_and_counted_per_step() -> None:
    events = [
        _event("gemm_kernel", 0, 6, DeviceType.CUDA, "kernel"),
        _event("gemm_kernel", 6, 10, DeviceType.CUDA, "kernel"),
        _event("rmsnorm", 10, 11, DeviceType.CUDA, "kernel"),
        _event("softmax", 11, 14, DeviceType.CUDA, "kernel"),
        _event("step", 0, 20, DeviceType.CUDA, "gpu_user_annotation"),  # not a kernel
        _event("aten::mm", 0, 10),  # a host operator
    ]
    ranked = top_kernels(events, num_steps=2, limit=2)
    assert [name for name, _, _ in ranked] == ["gemm_kernel", "softmax"]
    assert ranked[0][1:] == pytest.approx((1.0, 5.0 / 1000))
    assert ranked[1][1:] == pytest.approx((0.5, 1.5 / 1000))


def test_what_the_step_before_the_window_runs_on_the_device_is_not_counted() -> None:
    """With the host one step ahead, the unrecorded step's graph is still running when the
    recording starts: its kernels are recorded, but not the calls that launched them."""
    events = [
        _event("tail_of_the_step_before", 0, 5, DeviceType.CUDA, "kernel", correlation=7),
        _event("aten::copy_", 1, 2),
        _event("cudaMemcpyAsync", 1, 2, correlation=8),
        _event("cudaGraphLaunch", 2, 3, correlation=9),
        _event("Memcpy HtoD", 5, 6, DeviceType.CUDA, "gpu_memcpy", correlation=8),
        _event("gemm_kernel", 6, 10, DeviceType.CUDA, "kernel", correlation=9),
        _event("rmsnorm", 10, 11, DeviceType.CUDA, "kernel", correlation=9),
    ]
    kept = launched_in_window(events)
    assert [e.name for e in kept if e.device_type is DeviceType.CUDA] == [
        "Memcpy HtoD",
        "gemm_kernel",
        "rmsnorm",
    ]
    assert len(kept) == len(events) - 1  # the host events stay
    launches, device_ms = count_launches(kept, cuda=True)
    assert launches == 3 and device_ms == pytest.approx(6 / 1000)
    # without any launch call (a CPU profile) nothing is dropped
    cpu_only = [_event("aten::mm", 0, 1), _event("aten::add", 1, 2)]
    assert launched_in_window(cpu_only) == cpu_only


def test_windows_measured_as_one_sum_their_steps_and_weigh_acceptance_by_steps() -> None:
    from eagletree.app.bench.measure import merged

    first = DecodeMeasurement(2, 10, 60, 0.5, 3.0, None, step_seconds=(0.05,) * 10)
    second = DecodeMeasurement(2, 30, 100, 1.5, 5.0 / 3.0, None, num_ended_early=1,
                               ended_early_reason="eos", step_seconds=(0.05,) * 30)  # fmt: skip
    m = merged([first, second])
    assert (m.num_steps, m.num_tokens, m.seconds) == (40, 160, 2.0)
    assert m.tokens_per_step == pytest.approx((10 * 3.0 + 30 * 5.0 / 3.0) / 40)  # 2.0
    assert m.tokens_per_s == pytest.approx(80.0) and m.ms_per_step == pytest.approx(50.0)
    assert (m.num_ended_early, m.ended_early_reason) == (1, "eos")
    assert len(m.step_seconds) == 40 and m.batch_size == 2
    assert m.window_tokens_per_s == pytest.approx((120.0, 100.0 / 1.5))  # each window's own


@pytest.mark.parametrize("num_engines", [1, 2, 3, 5])
def test_each_engine_runs_first_once_in_as_many_draws_as_engines(num_engines: int) -> None:
    orders = [turn_order(num_engines, draw) for draw in range(2 * num_engines)]
    assert all(sorted(order) == list(range(num_engines)) for order in orders)
    # over any num_engines draws in a row each engine leads once
    for start in range(num_engines):
        leads = [order[0] for order in orders[start : start + num_engines]]
        assert sorted(leads) == list(range(num_engines))
