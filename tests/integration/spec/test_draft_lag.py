"""Plain steps leave their tokens in the draft's lag and a catch-up extends the draft over them
in one forward: the draft ends in the state it reaches when it extends after every plain step —
the same top-k, probabilities and hidden state, so the trees drafted after a run of plain steps
are the ones drafted without the lag — whatever each row's lag when the catch-up comes (rows
that joined mid-run, a run longer than the lag, a drafting step that must wait for it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch

from eagletree.app.workers.decode_window import DecodeWindow
from eagletree.app.workers.draft_state import DraftInput, DraftLag, DraftStateStore, lag_width
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.domain.draft_shape import PLAIN, DraftShape, reserved_slots
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams
from eagletree.domain.tree import TreeMaskMode
from tests.conftest import requires_triton
from tests.integration.spec.harness import (
    SIZES,
    RecordingPolicy,
    SpecEngine,
    SpecModels,
    load_spec_models,
    ragged_prompts,
    speculative_engine,
)

TREE = DraftShape(3, 2, 6)
CHAIN = DraftShape.chain(2)


class ScriptedShapes(RecordingPolicy):
    """A test policy: the i-th decode step drafts ``script[i]`` (the last one after that);
    counts its ``calls`` and records every observed path."""

    def __init__(self, shapes: Sequence[DraftShape], script: Sequence[DraftShape]) -> None:
        super().__init__(shapes)
        self._script = list(script)
        self.calls = 0

    def pick(self, decode: Sequence[Request]) -> DraftShape:
        shape = self._script[min(self.calls, len(self._script) - 1)]
        self.calls += 1
        return shape


@pytest.fixture(scope="module", params=["eagle", "eagle3"])
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SpecModels:
    root = tmp_path_factory.mktemp(request.param)
    return load_spec_models(root, "llama", request.param, torch.device("cpu"))


def _run(
    models: SpecModels,
    script: Sequence[DraftShape],
    lag_width: int | None,
    kernels: StepKernels = REFERENCE_KERNELS,
    graph_buckets: Sequence[int] = (),
    watch: Callable[[SpecEngine], None] | None = None,
) -> tuple[SpecEngine, ScriptedShapes, list[Request]]:
    """Three requests (the third joins at the fourth decode step) stepped through ``script``;
    with ``lag_width`` the worker's lag is replaced by one that wide (1: a catch-up every
    step); ``graph_buckets``: steps padded to them (eagerly, on the CPU); ``watch`` is given
    the engine before its first step."""
    policy = ScriptedShapes((TREE, PLAIN, CHAIN), script)
    spec = speculative_engine(
        models,
        3,
        2,
        6,
        policy=policy,
        kernels=kernels,
        graph_buckets=graph_buckets,
        context_len=192,
    )
    if lag_width is not None:
        state = spec.worker._state
        state.lag = DraftLag(state.bonus_tokens.shape[0], lag_width, state.bonus_tokens.device)
    if watch is not None:
        watch(spec)
    prompts = ragged_prompts(SIZES.vocab_size, [5, 9, 7], seed=4)
    params = SamplingParams(max_new_tokens=160)  # past the longest script's steps
    requests = [spec.engine.submit(p, params) for p in prompts[:2]]
    while policy.calls < len(script):
        if policy.calls == 3:
            requests.append(spec.engine.submit(prompts[2], params))
        spec.engine.step()
    return spec, policy, requests


def _draft_states(spec: SpecEngine, requests: Sequence[Request]) -> list[torch.Tensor]:
    state = spec.worker._state
    rows = torch.tensor([r.row for r in requests])
    return [state.bonus_tokens[rows], state.topk_index[rows], state.topk_p[rows],
            state.hidden_states[rows].float()]  # fmt: skip


LAG = lag_width((TREE, PLAIN, CHAIN), TreeMaskMode.QLEN_ONLY)


@pytest.mark.parametrize(
    "plain_run",
    [3, LAG, LAG + 5, 3 * LAG + 1],
    ids=["shorter-than-the-lag", "as-long-as-the-lag", "past-the-lag", "thrice-past"],
)
def test_a_run_of_plain_steps_leaves_the_draft_as_extending_after_each_would(
    models: SpecModels, plain_run: int
) -> None:
    # a tree chosen while rows lag waits one step for the catch-up (a plain step), unless the
    # run's last plain step caught up: the worker without a lag runs that plain step as chosen
    lagging_script = [TREE, TREE, *[PLAIN] * plain_run, TREE, TREE, CHAIN, TREE]
    waits = plain_run % LAG != 0
    eager_script = [TREE, TREE, *[PLAIN] * plain_run, PLAIN if waits else TREE, TREE, CHAIN, TREE]
    lagging, lagging_policy, lagging_requests = _run(models, lagging_script, None)
    eager, eager_policy, eager_requests = _run(models, eager_script, 1)

    assert lagging.worker._state.lag.width == LAG > 1  # the default worker does defer
    # what ran, step by step, is the script without the lag (what /metrics counts)
    assert lagging.worker.shape_steps == Counter(eager_script) == eager.worker.shape_steps
    assert lagging_policy.chosen == Counter(lagging_script)  # what the policy asked for
    assert [r.output_ids for r in lagging_requests] == [r.output_ids for r in eager_requests]
    for ours, theirs in zip(
        _draft_states(lagging, lagging_requests), _draft_states(eager, eager_requests), strict=True
    ):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the trees drafted after the run offered the same candidates at every depth
    assert lagging_policy.observed == eager_policy.observed
    assert len(lagging_policy.observed) >= 3 * 3  # three requests through the last three trees
    assert torch.all(lagging.worker._state.lag.count == 0)  # the draft read every pair


def test_a_catch_up_writes_no_slot_its_request_does_not_own(
    models: SpecModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a catch-up's block, as wide as the lag (wider here than any shape's window), starts
    # behind the committed length and reaches up to its width past it: the scheduler keeps
    # that much backed, or the draft's KV would land in slots of other requests or of none
    watched: list[SpecEngine] = []
    blocks: list[tuple[dict[int | None, int], torch.Tensor, torch.Tensor, torch.Tensor]] = []
    extend = EagleWorkerV2._extend_over_lag

    def recorded(worker: EagleWorkerV2, window: DecodeWindow, rows: torch.Tensor) -> DraftInput:
        # read back after the run: the step runs under the host-sync tripwire
        owned = {r.row: r.allocated_len for r in watched[0].engine.scheduler.running}
        lag = worker._state.lag
        ends = window.seq_lens + 1 - lag.count[rows] + lag.width  # (bs,) past the block's end
        blocks.append((owned, window.req_pool_indices.clone(), window.seq_lens.clone(), ends))
        return extend(worker, window, rows)

    def watch(spec: SpecEngine) -> None:
        watched.append(spec)
        spec.engine.scheduler.grow_ahead = 0  # as while requests wait: windows hold the reserve

    monkeypatch.setattr(EagleWorkerV2, "_extend_over_lag", recorded)
    script = [TREE, *[PLAIN] * 3, TREE, *[PLAIN] * (LAG + 3), CHAIN, TREE]
    _run(models, script, None, watch=watch)
    past = []  # how far past its committed length each request's block reached
    for owned, rows, lengths, ends in blocks:
        for row, length, end in zip(rows.tolist(), lengths.tolist(), ends.tolist(), strict=True):
            if row in owned:  # not a padding row
                assert end <= owned[row], (row, end, owned[row])
                past.append(end - length)
    assert len(blocks) >= 3  # after the first run, before the tree; the lag filling; the chain
    assert max(past) > reserved_slots((TREE, CHAIN))  # past two of the widest windows


@pytest.mark.parametrize("graph_buckets", [(), (4,)], ids=["exact", "padded"])
def test_the_fused_plain_step_writes_leave_the_state_the_reference_writes_leave(
    models: SpecModels, graph_buckets: tuple[int, ...]
) -> None:
    # runs of plain steps past the lag, catch-ups, a row joining mid-run (padded: batches of 2
    # and 3 padded to 4 with the padding row repeated): the Triton kernel of a plain step's
    # writes in the worker (interpreted on the CPU) against the torch reference
    requires_triton("cpu")
    from eagletree.adapters.kernels.triton.plain_step_writes import plain_step_writes

    fused = REFERENCE_KERNELS._replace(plain_step_writes=plain_step_writes)
    script = [TREE, *[PLAIN] * (LAG + 3), CHAIN, CHAIN, *[PLAIN] * 4]
    reference, _, reference_requests = _run(models, script, None, graph_buckets=graph_buckets)
    kernel, _, kernel_requests = _run(models, script, None, fused, graph_buckets)
    assert kernel.worker._steps.buffers.padded == bool(graph_buckets)
    assert [r.output_ids for r in kernel_requests] == [r.output_ids for r in reference_requests]
    ours, theirs = kernel.worker._state, reference.worker._state
    for got, want in zip(
        _draft_states(kernel, kernel_requests),
        _draft_states(reference, reference_requests),
        strict=True,
    ):
        assert torch.equal(got, want)
    rows = torch.tensor([r.row for r in kernel_requests])
    assert torch.equal(ours.lag.count[rows], theirs.lag.count[rows])
    assert int(ours.lag.count[rows].max()) > 0  # the last plain steps left pairs behind
    assert ours.lag.features is not None and theirs.lag.features is not None
    assert torch.equal(ours.lag.features[rows], theirs.lag.features[rows])
    assert torch.equal(ours.lag.tokens[rows], theirs.lag.tokens[rows])


def test_each_read_back_decode_step_reports_the_time_of_the_shape_it_ran(
    models: SpecModels,
) -> None:
    # the tree after the plain run waits for a catch-up: that step ran (and is timed) as plain
    script = [TREE, TREE, PLAIN, PLAIN, PLAIN, TREE, TREE, CHAIN, TREE]
    spec, policy, _ = _run(models, script, None)
    ran = spec.worker.shape_steps
    assert ran == Counter({TREE: 4, PLAIN: 4, CHAIN: 1})
    # untimed: the first decode step (a tree: its predecessor, the prefill, was not read back as
    # a decode step) and the fourth (plain), which prefilled the third request beside its decode
    timed = Counter(shape for shape, *_ in policy.timed)
    assert timed == ran - Counter({TREE: 1, PLAIN: 1})
    assert all(seconds > 0 and not sampled for _, _, sampled, seconds, _ in policy.timed)
    assert {size for _, size, *_ in policy.timed} == {2, 3}
    # the one catch-up (in place of the tree after the plain run) is timed as one: a run of
    # plain steps prices it apart from the steps that leave their token in the lag
    catch_ups = [(i, shape) for i, (shape, *_, catch_up) in enumerate(policy.timed) if catch_up]
    assert catch_ups == [(3, PLAIN)]


def test_steps_inside_untimed_steps_and_the_first_after_them_teach_no_step_time(
    models: SpecModels,
) -> None:
    # a profiler's steps take several times their shape's time: the policy learns what they
    # accepted, not what they cost, nor what the first step after them took (its read-back
    # interval spans them)
    policy = ScriptedShapes((TREE, PLAIN, CHAIN), [TREE])
    spec = speculative_engine(models, 3, 2, 6, policy=policy)
    params = SamplingParams(max_new_tokens=60)
    for prompt in ragged_prompts(SIZES.vocab_size, [5, 9], seed=4):
        spec.engine.submit(prompt, params)
    for _ in range(4):
        spec.engine.step()
    timed, observed = len(policy.timed), len(policy.observed)
    assert timed > 0
    with spec.worker.untimed_steps():
        for _ in range(3):
            spec.engine.step()
    assert len(policy.timed) == timed
    assert len(policy.observed) == observed + 3 * 2  # two requests' paths a step
    for _ in range(3):
        spec.engine.step()
    assert len(policy.timed) == timed + 2


@pytest.mark.parametrize("plain_run", [4, LAG], ids=["caught-up-before-a-tree", "lag-full"])
def test_after_a_catch_up_the_draft_is_the_one_a_prefill_of_the_same_tokens_makes(
    models: SpecModels, plain_run: int
) -> None:
    # the catch-up runs at the run's last plain step (a full lag) or at the tree that follows
    script = [TREE, TREE, *[PLAIN] * plain_run, TREE]
    if plain_run % LAG == 0:
        script.pop()
    spec, _, requests = _run(models, script, None)
    assert torch.all(spec.worker._state.lag.count == 0)
    fresh = speculative_engine(models, 3, 2, 6, policy=ScriptedShapes((TREE, PLAIN), [TREE]))
    # each request's tokens but its pending one: the prefill samples that one (greedy)
    again = [
        fresh.engine.submit([*r.prompt_ids, *r.output_ids[:-1]], SamplingParams(max_new_tokens=8))
        for r in requests
    ]
    fresh.engine.step()  # the prefill alone: nothing was decoding
    for ours, theirs in zip(
        _draft_states(spec, requests), _draft_states(fresh, again), strict=True
    ):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_a_row_freed_with_tokens_in_its_lag_starts_its_next_request_with_none(
    models: SpecModels,
) -> None:
    script = [TREE, *[PLAIN] * (LAG + 3), TREE]
    policy = ScriptedShapes((TREE, PLAIN, CHAIN), script)
    spec = speculative_engine(models, 3, 2, 6, policy=policy, max_running=2)  # two rows
    first, second, third = ragged_prompts(SIZES.vocab_size, [6, 8, 5], seed=9)
    short = spec.engine.submit(first, SamplingParams(max_new_tokens=5))
    long = spec.engine.submit(second, SamplingParams(max_new_tokens=60))
    spec.engine.step()
    row = short.row
    while short.row is not None:
        spec.engine.step()
    assert int(spec.worker._state.lag.count[row]) > 0  # it finished inside the plain run
    newcomer = spec.engine.submit(third, SamplingParams(max_new_tokens=60))
    while policy.calls < len(script):
        spec.engine.step()
    assert newcomer.row == row
    fresh = speculative_engine(models, 3, 2, 6, policy=ScriptedShapes((TREE, PLAIN), [TREE]))
    live = [long, newcomer]
    again = [
        fresh.engine.submit([*r.prompt_ids, *r.output_ids[:-1]], SamplingParams(max_new_tokens=8))
        for r in live
    ]
    fresh.engine.step()
    for ours, theirs in zip(_draft_states(spec, live), _draft_states(fresh, again), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_lag_bound_covers_every_owned_row_and_clears_only_when_none_was_left_out() -> None:
    store = DraftStateStore(8, 2, 4, torch.float32, torch.device("cpu"), lag_width=4)
    a, b, c, d = (Request(i, [1, 2], SamplingParams(max_new_tokens=8), 64) for i in range(4))
    for row, request in enumerate((a, b, c, d), start=1):
        request.admit(row, 0.0)

    def step(prefill: list[Request], decode: list[Request], *, lagging: bool) -> int:
        store.retain([*decode, *prefill])
        store.own(prefill)
        store.ran(decode, lagging=lagging)
        return store.lag_bound

    assert step([a, b], [], lagging=True) == 0  # a prefill alone lags nothing
    assert step([], [a, b], lagging=True) == 1
    assert step([c], [a, b], lagging=True) == 2  # c lags less: a bound, not each row's lag
    assert step([], [a, b, c], lagging=True) == 3
    store.retain([a, b, c])
    store.ran([a, b], lagging=False)  # c was left out of the catch-up: it still lags
    assert store.lag_bound == 3
    assert step([d], [a, b, c], lagging=False) == 0  # d, prefilled beside it, lags nothing
    assert step([], [a, b, c, d], lagging=True) == 1
    store.retain([])  # every row freed
    assert store.lag_bound == 0 and len(store) == 0


def test_only_the_very_requests_found_owners_at_the_last_step_skip_the_lookups() -> None:
    store = DraftStateStore(8, 2, 4, torch.float32, torch.device("cpu"), lag_width=4)
    a, b, c = (Request(i, [1, 2], SamplingParams(max_new_tokens=8), 64) for i in range(3))
    a.admit(1, 0.0)
    b.admit(2, 0.0)
    assert not store.retain([a, b])  # not prefilled yet: no owners
    assert not store.retain([a, b])  # nor the second time: nothing learned it from a miss
    store.own([a, b])
    assert store.retain([a, b]) and store.retain([a, b])
    assert store.retain([b, a])  # another order: looked up, the same owners
    c.admit(2, 0.0)  # b ended; c took its row
    assert not store.retain([a, c])
    assert len(store) == 1  # b's state on c's row forgotten, not taken for c's
    store.own([c])
    assert store.retain([a, c]) and store.retain([a, c])
    assert not store.retain([a]) and len(store) == 1  # c ended: its row forgotten, a's kept
    with pytest.raises(RuntimeError, match="never prefilled"):
        store.check_owned([b])
