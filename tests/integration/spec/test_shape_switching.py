"""A speculative worker that drafts a different shape at every step — plain decoding, chains,
narrow and wide trees — stays lossless and leaks nothing, with and without overlap, under
retraction and abort; the adaptive policy measures its costs, learns its acceptance from the
steps it reads back and only ever chooses among its shapes."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile
from eagletree.domain.request import FinishReason, Request, RequestStatus
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.eagle_v2.engines import oracle_engine
from tests.integration.spec.harness import (
    SIZES,
    WEIGHT_STD,
    RecordingPolicy,
    SpecModels,
    greedy_outputs,
    load_spec_models,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)

DEFAULT = DraftShape(3, 2, 5)
SHAPES = (DEFAULT, PLAIN, DraftShape.chain(1), DraftShape.chain(4), DraftShape(2, 4, 8))
MAX_NEW = 14

ModelCache = Callable[[DraftKind], SpecModels]


class RandomShapes(RecordingPolicy):
    """A test policy: a random one of ``shapes`` every step; records what it observes."""

    def __init__(self, shapes: Sequence[DraftShape], seed: int) -> None:
        super().__init__(shapes)
        self._rng = random.Random(seed)

    def pick(self, decode: Sequence[Request]) -> DraftShape:
        return self._rng.choice(self.shapes)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    cache: dict[DraftKind, SpecModels] = {}

    def get(kind: DraftKind) -> SpecModels:
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            cache[kind] = load_spec_models(root, "llama", kind, torch.device("cpu"))
        return cache[kind]

    return get


def prompts(count: int, seed: int) -> list[list[int]]:
    lengths = [3 + (5 * i + seed) % 11 for i in range(count)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_random_shapes_every_step_emit_the_plain_greedy_tokens(
    models: ModelCache, kind: DraftKind, overlap: bool
) -> None:
    loaded = models(kind)
    batch = prompts(6, seed=3)
    expected = greedy_outputs(plain_engine(loaded), batch, MAX_NEW)
    policy = RandomShapes(SHAPES, seed=len(kind) + overlap)
    spec = speculative_engine(loaded, *_dims(DEFAULT), policy=policy, overlap=overlap)
    assert greedy_outputs(spec.engine, batch, MAX_NEW) == expected
    assert set(policy.chosen) == set(SHAPES)  # every shape ran
    assert spec.memory.allocator.available_size() == spec.memory.allocator.size


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_greedy_requests_beside_sampling_ones_in_drawn_drafts_emit_the_plain_greedy_tokens(
    models: ModelCache, overlap: bool
) -> None:
    # chains draw the sampling requests' drafts; the greedy ones in the same steps take the
    # argmax (one-hot rows), whichever shape a step drafts
    loaded = models("eagle3")
    batch = prompts(6, seed=4)
    expected = greedy_outputs(plain_engine(loaded), batch, MAX_NEW)
    policy = RandomShapes(SHAPES, seed=9)
    spec = speculative_engine(
        loaded, *_dims(DEFAULT), policy=policy, overlap=overlap, draw_drafts=True
    )
    requests = [
        spec.engine.submit(prompt, SamplingParams(MAX_NEW, temperature=float(i % 2), seed=i))
        for i, prompt in enumerate(batch)
    ]
    while spec.engine.has_work():
        spec.engine.step()
    greedy = [r.output_ids for r in requests[::2]]
    assert greedy == expected[::2]
    assert all(len(r.output_ids) == MAX_NEW for r in requests[1::2])
    drawn = {s for s in policy.chosen if s.topk == 1 and not s.is_plain}
    assert drawn == {DraftShape.chain(1), DraftShape.chain(4)}  # drawn chains ran
    assert spec.memory.allocator.available_size() == spec.memory.allocator.size


def test_after_deep_paths_of_random_shapes_the_draft_is_the_one_a_prefill_makes(
    models: ModelCache,
) -> None:
    # an oracle draft is accepted deeply, so every step re-extends paths of every length and
    # each switch leaves one shape's draft KV for another to read: the draft's hidden state
    # after them is the one a prefill of the same tokens computes (KV left stale by a switch
    # would keep the outputs lossless but change it, and with it what the draft proposes)
    loaded = models("eagle3")
    batch = prompts(3, seed=6)
    drafting = [shape for shape in SHAPES if not shape.is_plain]  # no lag left unread
    policy = RandomShapes(drafting, seed=2)
    spec, _, _ = oracle_engine(loaded, _dims(DEFAULT), batch, 64, policy=policy)
    requests = [spec.engine.submit(p, SamplingParams(max_new_tokens=64)) for p in batch]
    for _ in range(12):
        spec.engine.step()
    assert all(r.status is RequestStatus.RUNNING for r in requests)
    assert set(policy.chosen) == set(drafting)
    assert max(n for r in requests for n in r.emitted_per_step) >= 4  # deep paths
    fresh, _, _ = oracle_engine(
        loaded, _dims(DEFAULT), [[*r.prompt_ids, *r.output_ids[:-1]] for r in requests], 4
    )
    again = [
        fresh.engine.submit([*r.prompt_ids, *r.output_ids[:-1]], SamplingParams(max_new_tokens=4))
        for r in requests
    ]
    fresh.engine.step()  # the prefill alone
    ours, theirs = spec.worker._state, fresh.worker._state
    rows = torch.tensor([r.row for r in requests])
    fresh_rows = torch.tensor([r.row for r in again])
    assert torch.equal(ours.bonus_tokens[rows], theirs.bonus_tokens[fresh_rows])
    # column 0 is the oracle's mark of the path, the rest the head's own output
    torch.testing.assert_close(
        ours.hidden_states[rows, 1:].float(),
        theirs.hidden_states[fresh_rows, 1:].float(),
        atol=1e-4,
        rtol=1e-4,
    )


def test_padded_steps_of_every_shape_emit_the_plain_greedy_tokens(models: ModelCache) -> None:
    loaded = models("eagle")
    batch = prompts(5, seed=8)
    expected = greedy_outputs(plain_engine(loaded), batch, MAX_NEW)
    policy = RandomShapes(SHAPES, seed=5)
    spec = speculative_engine(loaded, *_dims(DEFAULT), policy=policy, graph_buckets=(1, 2, 4, 8))
    assert greedy_outputs(spec.engine, batch, MAX_NEW) == expected


def test_each_observed_path_says_what_its_step_accepted(models: ModelCache) -> None:
    loaded = models("eagle")
    policy = RandomShapes(SHAPES, seed=11)
    spec = speculative_engine(loaded, *_dims(DEFAULT), policy=policy)
    results = spec.engine.generate(prompts(4, seed=2), MAX_NEW)
    emitted = {r.request_id: list(r.acceptance.histogram) for r in results if r.acceptance}
    assert emitted
    for shape, _, path in policy.observed:
        depth = shape.num_steps
        assert len(path) == 2 * depth
        ranks, offered = path[:depth], path[depth:]
        accepted = sum(r >= 0 for r in ranks)
        assert ranks[:accepted] == [r for r in ranks if r >= 0]  # a prefix of the depths
        assert all(0 <= r < shape.topk for r in ranks[:accepted])
        assert all(r < o for r, o in zip(ranks[:accepted], offered, strict=False))
        assert offered[0] >= 1 and all(o == 0 for o in offered[accepted + 1 :])
    # one observation per request and verify step (plain steps verify nothing)
    verify_steps = sum(1 for shape, _, _ in policy.observed)
    speculative = sum(sum(h) for h in emitted.values())
    assert verify_steps <= speculative


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_thousand_random_requests_under_random_shapes_leave_no_slot_or_row_behind(
    models: ModelCache, overlap: bool
) -> None:
    loaded = models("eagle")
    # 140 slots: a request needs up to 16 + 8 + the reserve (64: two of the draft lag's 32-wide
    # catch-up blocks, wider than any window here) = 88; two do not fit
    policy = RandomShapes(SHAPES, seed=21)
    spec = speculative_engine(
        loaded,
        *_dims(DEFAULT),
        pool_size=140,
        max_running=16,
        overlap=overlap,
        policy=policy,
        draw_drafts=True,  # as shipped: the sampling requests draw their drafts
    )
    engine = spec.engine
    allocator, table = engine.scheduler.allocator, engine.scheduler.req_to_token_pool
    free_at_start, rows_at_start = allocator.available_size(), table.req_to_token.clone()
    rng = random.Random(15)
    submitted: list[Request] = []
    aborted: set[int] = set()
    while len(submitted) < 1000 or engine.has_work():
        for _ in range(rng.randrange(0, 8) if len(submitted) < 1000 else 0):
            prompt = [rng.randrange(SIZES.vocab_size) for _ in range(rng.randint(1, 16))]
            params = SamplingParams(
                rng.randint(1, 8), temperature=float(rng.randrange(2)), seed=len(submitted)
            )
            submitted.append(engine.submit(prompt, params))
        if rng.randrange(5) == 0:
            victim = rng.choice(submitted)
            if engine.abort(victim.request_id):
                aborted.add(victim.request_id)
        engine.step()
    engine.step()
    assert engine.stats.num_retracted > 0 and len(aborted) > 50  # both paths exercised
    assert allocator.available_size() == free_at_start
    assert torch.equal(table.req_to_token, rows_at_start)
    assert table.available_size() == table.size
    for request in submitted:
        assert request.status is RequestStatus.FINISHED
        assert (request.finish_reason is FinishReason.ABORT) == (request.request_id in aborted)
        if request.request_id not in aborted:
            assert len(request.output_ids) == request.params.max_new_tokens
    spec.worker.step(SchedulePlan([], [], [], []))
    assert spec.worker.num_tracked_requests == 0


def test_the_adaptive_policy_prices_its_shapes_and_learns_from_read_back_steps(
    models: ModelCache,
) -> None:
    loaded = models("eagle")
    batch = prompts(4, seed=6)
    expected = greedy_outputs(plain_engine(loaded), batch, MAX_NEW)
    # a prior that expects every draft accepted: speculation wins until steps say otherwise
    # (a plain step observes nothing, so a pessimistic prior would never learn)
    prior = RankProfile(((0.97,),))
    # no stall limit: on a shared CPU a tree step of the tiny pair may take 3 plain steps,
    # and a policy that may not draft learns nothing (what is tested here is the learning)
    policy = AdaptiveShapes(
        SHAPES, prior=prior, hysteresis=0.0, refresh_steps=1, stall_ratio=math.inf
    )
    spec = speculative_engine(loaded, *_dims(DEFAULT), policy=policy, graph_buckets=(1, 2, 4))
    spec.worker.calibrate()
    assert policy.costs is not None
    costs = policy.costs.measured
    assert costs.buckets == (1, 2, 4)
    assert {shape for shape, _, _ in costs.seconds} == set(SHAPES)
    assert all(seconds > 0 for seconds in costs.seconds.values())
    assert greedy_outputs(spec.engine, batch, MAX_NEW) == expected
    ran = spec.worker.shape_steps
    assert sum(ran.values()) > 0 and set(ran) <= set(SHAPES)
    # a random head accepts almost nothing: what it learned is far below the prior
    learned = policy.profile("greedy").rate(0, 0)
    assert learned < policy.profile("T>0.85").rate(0, 0)


def _dims(shape: DraftShape) -> tuple[int, int, int]:
    return shape.num_steps, shape.topk, shape.num_draft_tokens


def test_build_engine_with_the_adaptive_policy_prices_every_candidate_and_stays_lossless(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dependency_injector")
    from eagletree.app.composition.container import build_engine
    from eagletree.config.settings import EngineSettings

    target, draft = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=SIZES, dtype=torch.float32, std=WEIGHT_STD
    )
    assert draft is not None
    # the head's training report: the policy starts from its measured profiles
    greedy, sampled = [[0.7, 0.1], [0.5, 0.2]], [[0.4, 0.1]]
    report = {"steps": 1, "rank_profile": {"greedy": greedy, "sampled": sampled}}
    (draft / "training.json").write_text(json.dumps(report))
    model = {"target_path": str(target), "device": "cpu", "dtype": "float32"}
    common = {
        "backend": {"attention": "torch", "kv_move": "torch"},
        "memory": {"max_total_tokens": 2048, "max_running_requests": 4},
    }
    plain = build_engine(EngineSettings(model=model, **common))
    candidates = ["plain", "chain:S2", "tree:S2,k2,N4"]
    engine = build_engine(
        EngineSettings(
            model={**model, "draft_path": str(draft)},
            speculative={
                "algorithm": "eagle",
                "num_steps": 3,
                "eagle_topk": 2,
                "num_draft_tokens": 5,
                "policy": "adaptive",
                "candidate_shapes": candidates,
            },
            **common,
        )
    )
    policy = engine.worker.policy  # type: ignore[attr-defined]
    assert isinstance(policy, AdaptiveShapes)
    assert policy.shapes == (DEFAULT, PLAIN, DraftShape.chain(2), DraftShape(2, 2, 4))
    assert policy.costs is not None and policy.costs.buckets == (1, 2, 4)
    assert policy.profile("greedy").hit_rates == ((0.7, 0.1), (0.5, 0.2))
    assert policy.profile("T<=0.5").hit_rates == ((0.7, 0.1), (0.5, 0.2))
    assert policy.profile("T>0.85").hit_rates == ((0.4, 0.1),)
    batch = prompts(3, seed=12)
    assert greedy_outputs(engine, batch, MAX_NEW) == greedy_outputs(plain, batch, MAX_NEW)
    assert sum(engine.worker.shape_steps.values()) > 0  # type: ignore[attr-defined]
