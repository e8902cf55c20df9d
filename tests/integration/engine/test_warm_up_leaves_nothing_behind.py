"""An engine's warm-up prefills (run at start where its decode steps are captured) leave no
request, slot, statistic or learned acceptance behind, and the engine decodes as before."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.composition.container import build_engine, build_engine_container
from eagletree.app.composition.startup import warms_up
from eagletree.app.engine.loop import warm_up_lengths
from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.engine.reports import EngineStats
from eagletree.app.engine.worker import StepOutput
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.config.settings import EngineSettings
from tests.integration.spec.harness import SIZES, WEIGHT_STD, greedy_outputs, ragged_prompts


def test_warm_up_leaves_no_request_slot_statistic_or_acceptance_behind(tmp_path: Path) -> None:
    sizes = dataclasses.replace(SIZES, max_position_embeddings=512)  # prompts past 256
    target, draft = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=sizes, dtype=torch.float32, std=WEIGHT_STD
    )
    assert draft is not None
    model = {"target_path": str(target), "device": "cpu", "dtype": "float32"}
    common = {
        "backend": {"attention": "torch", "kv_move": "torch"},
        "memory": {"max_total_tokens": 2048, "max_running_requests": 4},
    }
    speculative = {"algorithm": "eagle", "policy": "adaptive",
                   "candidate_shapes": ["plain", "chain:S2", "tree:S2,k2,N4"]}  # fmt: skip
    settings = EngineSettings(model={**model, "draft_path": str(draft)},
                              speculative=speculative, **common)  # fmt: skip
    engine = build_engine(settings)
    slots = engine.scheduler.allocator.available_size()
    rows = engine.scheduler.req_to_token_pool.available_size()
    steps: list[tuple[list[tuple[int, float]], int]] = []  # (prefills, decode batch size)
    step = engine.worker.step

    def counted(plan: SchedulePlan) -> StepOutput:
        prefills = [(r.num_tokens, r.params.temperature) for r in plan.prefill]
        steps.append((prefills, len(plan.decode)))
        return step(plan)

    engine.worker.step = counted  # type: ignore[method-assign]
    warmed = engine.warm_up()
    engine.worker.step = step  # type: ignore[method-assign]
    # prefills of one request each, no decode step: greedy at lengths that meet every kernel
    # variant a prompt up to 256 tokens compiles, then one sampled
    assert all(len(prefills) == 1 and decode == 0 for prefills, decode in steps)
    greedy = [n for ((n, temperature),) in (p for p, _ in steps) if temperature == 0.0]
    sampled = [n for ((n, temperature),) in (p for p, _ in steps) if temperature > 0.0]
    assert len(sampled) == 1 and len(greedy) == len(set(greedy)) == len(steps) - 1 == warmed
    assert engine.max_context_len > 256
    assert {_variant(n) for n in range(1, 257)} == {_variant(n) for n in greedy}
    assert engine.stats == EngineStats()
    assert not engine.has_work()
    assert engine.scheduler.allocator.available_size() == slots
    assert engine.scheduler.req_to_token_pool.available_size() == rows
    policy = engine.worker.policy  # type: ignore[attr-defined]
    assert isinstance(policy, AdaptiveShapes) and policy.costs is not None
    assert policy.learned_profiles() == {}  # prefills verify nothing: no path was recorded
    assert all(
        policy.costs.observations(shape, 1, sampled) == 0
        for shape in policy.shapes
        for sampled in (False, True)
    )
    plain = build_engine(EngineSettings(model=model, **common))
    batch = ragged_prompts(SIZES.vocab_size, [3, 9, 14], seed=4)
    assert greedy_outputs(engine, batch, 12) == greedy_outputs(plain, batch, 12)
    assert engine.stats.num_finished == len(batch)  # counted from the warm-up's end


def _variant(prompt_len: int) -> tuple[int, bool, bool]:
    """What a prefill's kernels are compiled for: the power-of-two tile over its rows (for any
    power-of-two number of query heads a key head serves), and Triton's specialisation of an
    integer argument equal to 1 or divisible by 16."""
    return 1 << (prompt_len - 1).bit_length(), prompt_len == 1, prompt_len % 16 == 0


def test_warm_up_lengths_stop_at_the_longest_prompt_the_engine_takes() -> None:
    assert warm_up_lengths(20) == [n for n in warm_up_lengths(4096) if n <= 20]
    assert max(warm_up_lengths(20)) == 16 and warm_up_lengths(0) == []
    assert warm_up_lengths(4096) == warm_up_lengths(256)  # a longer prompt reuses its tiles


def test_a_pool_too_small_for_the_longest_lengths_warms_up_at_those_it_holds(
    tmp_path: Path,
) -> None:
    target, _ = write_random_checkpoint(
        tmp_path, "llama", None, sizes=SIZES, dtype=torch.float32, std=WEIGHT_STD
    )
    engine = build_engine(
        EngineSettings(
            model={"target_path": str(target), "device": "cpu", "dtype": "float32"},
            memory={"max_total_tokens": 48, "max_running_requests": 2},
        )
    )
    prefilled: list[int] = []
    step = engine.worker.step

    def counted(plan: SchedulePlan) -> StepOutput:
        prefilled.extend(r.num_tokens for r in plan.prefill)
        return step(plan)

    engine.worker.step = counted  # type: ignore[method-assign]
    engine.warm_up()  # a 256-token prompt would not fit: it is left out, not an error
    assert 31 in prefilled and max(prefilled) < 48
    assert not engine.has_work() and engine.scheduler.allocator.available_size() == 48


def test_an_engine_warms_up_where_its_decode_steps_are_captured_in_one_process() -> None:
    single = EngineSettings()
    assert warms_up(single, use_cuda_graphs=True)
    assert not warms_up(single, use_cuda_graphs=False)  # the CPU: no Triton kernel to compile
    assert not warms_up(EngineSettings(parallel={"tp_size": 2}), use_cuda_graphs=True)
    assert not warms_up(EngineSettings(parallel={"dp_size": 2}), use_cuda_graphs=True)


def test_the_engine_built_reports_how_long_its_warm_up_took(tmp_path: Path) -> None:
    target, _ = write_random_checkpoint(
        tmp_path, "llama", None, sizes=SIZES, dtype=torch.float32, std=WEIGHT_STD
    )
    settings = EngineSettings(
        model={"target_path": str(target), "device": "cpu", "dtype": "float32"},
        memory={"max_total_tokens": 48, "max_running_requests": 2},
    )
    lines: list[str] = []
    container = build_engine_container(settings, progress=lines.append)
    container.engine.add_kwargs(warm_up=True)  # (the CPU has no Triton kernel to compile)
    engine = container.engine()
    (line,) = [line for line in lines if line.startswith("warmed up")]
    match = re.fullmatch(r"warmed up the prefills of (\d+) prompt lengths in \d+\.\d s", line)
    assert match is not None and int(match[1]) == engine.warm_up() > 0
