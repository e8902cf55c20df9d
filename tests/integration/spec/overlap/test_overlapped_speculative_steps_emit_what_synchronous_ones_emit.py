"""The engine's overlap mode (one step in flight) against the synchronous loop for
the v2 workers: identical tokens for every target kind, eager and padded, seeded
sampling and multi-layer MTP; the host lengths equal the device's between steps, and
a full tree mask never runs ahead. Every v2 / MTP-v2 step here runs under the sync
tripwire (``tests/integration/conftest.py``), strictly so when it is launched ahead of
the host."""

from __future__ import annotations

import pytest

from eagletree.adapters.models.random_checkpoint_config import sizes_with
from eagletree.domain.sampling import SamplingParams
from eagletree.domain.tree import TreeMaskMode
from tests.integration.spec.harness import (
    SIZES,
    greedy_outputs,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.multi_layer_mtp.engines import NUM_LAYERS, mtp_engine
from tests.integration.spec.overlap.runs import (
    CONFIGS,
    MAX_NEW,
    MODELS,
    ModelCache,
    assert_ran_ahead,
    prompts_for,
    summary,
)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "S{}k{}N{}".format(*c))
@pytest.mark.parametrize("model", MODELS, ids=lambda m: "-".join(m))
@pytest.mark.parametrize("buckets", [(), (2, 4, 8)], ids=["eager", "padded"])
def test_overlapped_v2_steps_emit_what_synchronous_ones_emit(
    models: ModelCache,
    model: tuple[str, str],
    config: tuple[int, int, int],
    buckets: tuple[int, ...],
) -> None:
    loaded = models(*model)
    prompts = prompts_for(6, seed=sum(config))
    expected = greedy_outputs(plain_engine(loaded), prompts, MAX_NEW)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(loaded, *config, graph_buckets=buckets, overlap=overlap)
        results = spec.engine.generate(prompts, MAX_NEW)
        assert [r.output_ids for r in results] == expected
        runs.append(summary(results))
        assert spec.memory.allocator.available_size() == spec.memory.allocator.size
    assert_ran_ahead(spec.engine)
    assert runs[0] == runs[1]


def test_without_a_step_in_flight_the_host_lengths_are_the_devices(models: ModelCache) -> None:
    """The device's committed lengths drive the steps; the host's drive windows and releases."""
    loaded = models("llama", "eagle")
    spec = speculative_engine(loaded, 5, 4, 8)
    for prompt in prompts_for(4, seed=8):
        spec.engine.submit(prompt, SamplingParams(MAX_NEW))
    committed = spec.worker.step_runner.buffers.committed
    assert committed is not None
    num_checked = 0
    while spec.engine.has_work():
        spec.engine.step()
        for request in spec.engine.scheduler.running:
            assert request.row is not None
            assert int(committed[request.row]) == request.committed_len, request
            num_checked += 1
    assert num_checked > 10


@pytest.mark.parametrize(
    ("config", "draw"),
    [((5, 4, 8), False), ((3, 1, 4), True), ((5, 4, 8), True)],
    ids=["tree", "drawn-chain", "drawn-tree"],
)
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_overlapped_seeded_sampling_draws_the_synchronous_samples(
    models: ModelCache, temperature: float, config: tuple[int, int, int], draw: bool
) -> None:
    loaded = models("llama", "eagle3")
    prompts = prompts_for(5, seed=7)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(loaded, *config, overlap=overlap, draw_drafts=draw)
        results = spec.engine.generate(
            prompts, MAX_NEW, temperature=temperature, top_p=0.9, seed=11
        )
        runs.append(summary(results))
    assert_ran_ahead(spec.engine)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("oracle", [False, True], ids=["random", "oracle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_overlapped_mtp_steps_emit_what_synchronous_ones_emit(
    models: ModelCache, oracle: bool, temperature: float
) -> None:
    loaded = models(
        "deepseek-mla", "mtp", sizes_with(SIZES, num_mtp_layers=NUM_LAYERS["deepseek-mla"])
    )
    # prompts of 1 and 2 tokens are shorter than S − 1 = 2: their first steps are ragged, which
    # the engine runs only from exact lengths (it reads the step in flight first)
    prompts = ragged_prompts(SIZES.vocab_size, [1, 2, 9, 4, 12], seed=5)
    expected = greedy_outputs(plain_engine(loaded), prompts, MAX_NEW)
    runs = []
    for overlap in (False, True):
        mtp = mtp_engine(loaded, 3, prompts=prompts if oracle else (), overlap=overlap)
        results = mtp.engine.generate(prompts, MAX_NEW, temperature=temperature, seed=2)
        if temperature == 0.0:
            assert [r.output_ids for r in results] == expected
        # the layer oracle's deliberate errors come from its own generator: not compared
        runs.append(summary(results, acceptance=not oracle))
        assert mtp.allocator.available_size() == mtp.allocator.size
    assert_ran_ahead(mtp.engine)
    assert runs[0] == runs[1]


def test_a_full_tree_mask_never_runs_ahead_and_still_emits_the_same_tokens(
    models: ModelCache,
) -> None:
    loaded = models("llama", "eagle")
    prompts = prompts_for(3, seed=3)
    runs = []
    for overlap in (False, True):
        spec = speculative_engine(
            loaded, 3, 2, 6, mask_mode=TreeMaskMode.FULL_MASK, overlap=overlap
        )
        runs.append(summary(spec.engine.generate(prompts, MAX_NEW)))
    assert spec.engine.stats.num_steps_ahead == 0  # its mask is sized from Σ L_b on the host
    assert runs[0] == runs[1]
