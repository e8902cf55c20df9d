"""benchmarks/policy_replay.py and replay_drafts.py: the draft model's paths, and the adaptive
policy replayed on measured costs."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import policy_replay, replay_drafts
from benchmarks.bench_run import Cell, Run, read_run, switch_offsets
from benchmarks.policy_replay import replay_cell
from benchmarks.replay_clock import StepClock
from benchmarks.replay_drafts import DraftModel, accepted_drafts
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile, max_draft_tokens
from tests.hypothesis_profiles import examples

CHAIN3, CHAIN5 = DraftShape.chain(3), DraftShape.chain(5)


def test_a_chain_of_steady_nodes_accepts_each_depth_at_ease_times_confidence() -> None:
    model = DraftModel(1.0, 0.0, 2.0, 0.0, tail=0.5, request_spread=0.0)
    rate = 1 / (1 + math.exp(-1.0)) * 1 / (1 + math.exp(-2.0))
    generator = torch.Generator().manual_seed(0)
    tokens = model.tokens_per_step(DraftShape.chain(4), generator, steps=20_000)
    assert tokens == pytest.approx(1 + sum(rate**d for d in range(1, 5)), abs=0.05)


@pytest.mark.parametrize("persistence", [0.0, 0.5, 0.9])
def test_a_requests_ease_carries_over_by_its_persistence_its_spread_unchanged(
    persistence: float,
) -> None:
    model = DraftModel(1.0, 1.0, 2.0, 0.0, persistence=persistence)
    generator = torch.Generator().manual_seed(0)
    draws = [model.ease_noise(4000, generator)]
    for _ in range(3):
        draws.append(model.ease_noise(4000, generator, draws[-1]))
    for before, after in itertools.pairwise(draws):
        assert float(after.var()) == pytest.approx(1.0, abs=0.08)
        correlation = float(torch.corrcoef(torch.stack([before, after]))[0, 1])
        assert correlation == pytest.approx(persistence, abs=0.05)


def test_persistent_ease_leaves_a_chains_mean_and_ties_its_steps() -> None:
    # the same model but for persistence: a chain's tokens a step keep their mean, and a
    # request's consecutive steps commit alike
    def steps(persistence: float) -> torch.Tensor:
        model = DraftModel(1.5, 1.5, 3.0, 0.5, request_spread=0.0, persistence=persistence)
        generator = torch.Generator().manual_seed(1)
        factors = model.request_factors(2000, generator)
        noise = model.ease_noise(2000, generator)
        committed = []
        for _ in range(6):
            ranks, _ = model.paths(CHAIN5, factors, generator, noise)
            committed.append(accepted_drafts(ranks).double())
            noise = model.ease_noise(2000, generator, noise)
        return torch.stack(committed)  # (steps, requests)

    fresh, lasting = steps(0.0), steps(0.9)
    assert float(lasting.mean()) == pytest.approx(float(fresh.mean()), rel=0.05)

    def lag_one(x: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([x[:-1].flatten(), x[1:].flatten()]))[0, 1])

    assert abs(lag_one(fresh)) < 0.05
    assert lag_one(lasting) > 0.2  # 0.29: the nodes' own coins blur the ease


@st.composite
def _models_and_shapes(draw: st.DrawFn) -> tuple[DraftModel, DraftShape]:
    spread = st.floats(0.0, 3.0)
    model = DraftModel(draw(st.floats(-2, 5)), draw(spread), draw(st.floats(-1, 5)),
                       draw(spread), draw(st.floats(0.05, 0.95)))  # fmt: skip
    steps, k = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    n = draw(st.integers(2, max_draft_tokens(steps, k))) if k > 1 else steps + 1
    return model, DraftShape(steps, k, n)


@given(_models_and_shapes(), st.integers(0, 2**16))
@settings(max_examples=examples(60), deadline=None)
def test_a_path_accepts_only_what_its_tree_offered(
    case: tuple[DraftModel, DraftShape], seed: int
) -> None:
    model, shape = case
    generator = torch.Generator().manual_seed(seed)
    ranks, offered = model.paths(shape, model.request_factors(16, generator), generator)
    accepted = accepted_drafts(ranks)
    for row_ranks, row_offered, count in zip(ranks, offered, accepted, strict=True):
        count = int(count)
        assert count <= min(shape.num_steps, shape.num_draft_tokens - 1)
        assert (row_ranks[count:] == -1).all()  # nothing after the first miss
        # every accepted rank was among the candidates verified under the path
        assert (row_ranks[:count] < row_offered[:count]).all()
        assert (row_offered[:count] <= shape.topk).all()
        assert (row_offered[count + 1 :] == 0).all()  # depths the path never reached
        if shape.topk == 1 and count < shape.num_steps:
            assert row_offered[count] == 1  # a chain offers its one draft wherever it reaches


def _run(costs_ms: dict[DraftShape, float], batch_size: int = 4) -> tuple[Run, Cell]:
    """A run whose every step of a shape takes the same time, at every bucket."""
    buckets = (1, 2, 4)
    seconds = {(s, b, False): ms / 1e3 for s, ms in costs_ms.items() for b in buckets}
    catch_up = {(b, False): 1.2 * costs_ms[PLAIN] / 1e3 for b in buckets}
    cell = Cell(batch_size, 0.0, {s: [ms / 1e3] for s, ms in costs_ms.items()}, {}, {})
    costs = StepCosts(buckets, seconds, catch_up, 4)
    run = Run([cell], costs, tuple(costs_ms), False, 64, 1, {})
    return run, cell


@pytest.mark.parametrize(
    ("costs_ms", "best"),
    [
        ({CHAIN3: 1.2, PLAIN: 1.0, CHAIN5: 3.0}, CHAIN3),  # the deeper chain's step too dear
        ({CHAIN3: 1.2, PLAIN: 1.0, CHAIN5: 1.25}, CHAIN5),  # nearly free: the deeper wins
    ],
)
def test_the_replayed_policy_finds_the_fastest_shape(
    costs_ms: dict[DraftShape, float], best: DraftShape
) -> None:
    run, cell = _run(costs_ms)
    model = DraftModel(3.0, 0.5, 3.0, 0.5)
    fixed = {
        shape: replay_cell(run, cell, model, shape, min_requests=32, seed=1).tokens_per_s
        for shape in costs_ms
    }
    assert max(fixed, key=lambda s: fixed[s]) == best
    policy = AdaptiveShapes(run.candidates)
    policy.use_costs(run.costs)
    replayed = replay_cell(run, cell, model, policy, min_requests=32, seed=1)
    assert replayed.ran.most_common(1)[0][0] == best
    assert replayed.tokens_per_s >= 0.9 * fixed[best]
    # plain steps commit a token a request, a drafting step more: the fixed engines' rates
    assert fixed[PLAIN] == pytest.approx(cell.batch_size / 1e-3)
    assert fixed[CHAIN3] > fixed[PLAIN] / 1.2


def test_the_report_replays_every_cell_of_a_bench_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, values in (("EASE_MEANS", (3.0,)), ("EASE_SPREADS", (0.5,)),
                         ("CONFIDENCE_MEANS", (3.0,)), ("CONFIDENCE_SPREADS", (0.5, 1.5)),
                         ("TAILS", (0.5,))):  # fmt: skip
        monkeypatch.setattr(replay_drafts, name, values)  # a grid of two points: quick
    shapes = {"plain": (0, 1, 1, 1.0, 1.0), "chain S3": (3, 1, 4, 1.3, 3.2)}
    step_costs = [
        {"shape": label, "num_steps": s, "topk": k, "num_draft_tokens": n, "bucket": b,
         "sampled": sampled, "measured_ms": ms}
        for label, (s, k, n, ms, _) in shapes.items() for b in (1, 2) for sampled in (False, True)
    ]  # fmt: skip
    rows = [
        {"config": label, "batch_size": bs, "temperature": 0.0, "step_ms": [ms, 1.1 * ms],
         "tokens_per_step": tokens, "tokens_per_s": bs * tokens / ms * 1e3}
        for label, (_, _, _, ms, tokens) in shapes.items() for bs in (1, 2)
    ] + [{"config": "adaptive (mostly chain S3, 90 %)", "batch_size": bs, "temperature": 0.0,
          "tokens_per_s": 2000.0 * bs} for bs in (1, 2)]  # fmt: skip
    speculative = {"candidate_shapes": ["chain:S3", "plain"], "sampled_drafts": "drawn"}
    # the head's priors the engine started from: the replayed policy starts there too
    state = {"step_costs": step_costs, "catch_ups": [],
             "head_priors": {"greedy": [[0.75, 0.125]], "sampled": [[0.5, 0.25]]}}  # fmt: skip
    bench = {
        "rows": rows,
        "adaptive": {"adaptive": state},
        "settings": {"engines": {"adaptive": {"speculative": speculative}},
                     "argv": {"new_tokens": 16, "repeats": 1}},
    }  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps(bench))
    out = tmp_path / "replay.md"
    # a count among the options reaches the policy as one (it indexes the batch's paths)
    argv = ["--run", str(path), "--seeds", "1", "--min-requests", "2",
            "--option", "observe_per_step=4", "--out", str(out)]  # fmt: skip
    assert policy_replay.main(argv) == 0
    table = [line for line in out.read_text().splitlines() if line.startswith("| 0 |")]
    assert [line.split(" | ")[1] for line in table] == ["1", "2"]
    # the replayed best fixed shape is the chain (3.2 tokens for 1.3 × a plain step)
    assert all("| chain S3 (plain " in line for line in table)
    # the GPU's own adaptive ÷ best fixed: 2000 tok/s a request against the chain's 2462
    assert all(line.endswith("| 0.81 |") for line in table)
    assert capsys.readouterr().out.startswith("Policy replay of")
    header = out.read_text().splitlines()[0]
    assert "head priors: greedy, sampled, observe_per_step=4)" in header
    assert read_run(path).head_priors == {
        "greedy": RankProfile(((0.75, 0.125),)),
        "sampled": RankProfile(((0.5, 0.25),)),
    }
    # one batch size's cells alone; a batch size the run has not is refused
    assert policy_replay.main([*argv, "--batch-sizes", "2"]) == 0
    text = out.read_text()
    assert [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| 0 |")] == ["2"]
    assert ", bs 2 only," in text.splitlines()[0]
    with pytest.raises(SystemExit):
        policy_replay.main([*argv, "--batch-sizes", "3"])
    assert "--batch-sizes 3: the run has no cell of these batch sizes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--option", "hysteresis"], "--option wants NAME=VALUE"),
        (["--option", "warp=2"], "--option warp: not an AdaptiveShapes argument"),
        (["--option", "observe_per_step=2.5"], "--option observe_per_step: a whole number"),
        (["--draft-dir", "."], "holds no training.json"),
        (["--seeds", "0"], "must be at least 1"),
        (["--run", "no-such-run.json"], "--run no-such-run.json is not a file"),  # the last wins
    ],
)
def test_bad_arguments_end_in_one_line_naming_the_flag(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        policy_replay.main(["--run", str(path), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_host_stalls_stretch_whatever_shape_runs_where_the_cell_met_them() -> None:
    # the chain's row met a stall of two steps (4 and 6 x its median); plain's none
    chain = [1.0, 1.0, 4.0, 6.0, 1.0, 1.0, 1.0]
    cell = Cell(4, 0.0, {CHAIN3: chain, PLAIN: [0.5] * 5}, {}, {})
    costs = StepCosts((4,), {(s, 4, False): 1.0 for s in (CHAIN3, PLAIN)}, {}, 1)
    timeline = [1.0, 1.0, 4.0, 6.0, 1.0, 1.0, 1.0] + [1.0] * 5
    clock = StepClock(cell, costs, random.Random(3), host_stalls=True)
    # a whole turn of the timeline on plain steps: its calm 0.5 s, stretched where it stalled
    assert sorted(clock(PLAIN) for _ in timeline) == sorted(0.5 * f for f in timeline)
    # the chain's own stalled steps are not among its calm ones: no stall counted twice
    assert sorted(clock(CHAIN3) for _ in timeline) == sorted(timeline)
    # without host stalls a step is any of its shape's measured ones
    plain = StepClock(cell, costs, random.Random(3))
    assert {plain(CHAIN3) for _ in range(200)} == set(chain)


def test_a_step_is_drawn_from_the_steps_at_its_place_in_their_windows() -> None:
    # two windows of eight steps, each window's steps the longer the later (their contexts)
    window = [1.0, 1.0, 1.1, 1.1, 1.2, 1.2, 1.3, 1.4]
    cell = Cell(4, 0.0, {CHAIN3: window * 2, PLAIN: [0.5] * 4}, {}, {}, {CHAIN3: 2})
    costs = StepCosts((4,), {(s, 4, False): 1.0 for s in (CHAIN3, PLAIN)}, {}, 1)
    clock = StepClock(cell, costs, random.Random(3))
    for index, seconds in enumerate(window):
        place = (index + 0.5) / len(window)
        assert {clock(CHAIN3, place=place) for _ in range(20)} == {seconds}
    # without a place, any step of the row
    assert {clock(CHAIN3) for _ in range(200)} == set(window)


def test_a_switch_offset_is_a_switched_steps_median_over_its_shapes_own() -> None:
    # chain S3 steps take 1.0 after their own and 1.3 after chain S5's, chain S5 steps 2.0
    # after either (11 switches each way); a catch-up (None) breaks the sequence
    steps: list[tuple[DraftShape | None, float]] = [(CHAIN3, 1.0)]
    for _ in range(11):
        steps += [(CHAIN3, 1.0), (CHAIN5, 2.0), (CHAIN5, 2.0), (CHAIN3, 1.3), (CHAIN3, 1.0)]
    steps += [(None, 5.0), (CHAIN3, 9.0)]
    assert switch_offsets(steps) == {(CHAIN5, CHAIN3): pytest.approx(0.3), (CHAIN3, CHAIN5): 0.0}
    assert switch_offsets(steps[:-12]) == {}  # nine switches each way: too few to read


def test_with_switches_a_step_after_another_shape_takes_the_cells_offset() -> None:
    cell = Cell(4, 0.0, {CHAIN3: [1.0], CHAIN5: [2.0], PLAIN: [0.5]}, {}, {})
    cell.switch_offsets[(CHAIN5, CHAIN3)] = 0.25
    costs = StepCosts((4,), {(s, 4, False): 1.0 for s in (CHAIN3, CHAIN5, PLAIN)}, {}, 1)
    clock = StepClock(cell, costs, random.Random(3), switches=True)
    assert clock(CHAIN3, after=CHAIN5) == 1.25
    assert clock(CHAIN3, after=CHAIN3) == clock(CHAIN5, after=CHAIN3) - 1.0 == 1.0
    assert StepClock(cell, costs, random.Random(3))(CHAIN3, after=CHAIN5) == 1.0
