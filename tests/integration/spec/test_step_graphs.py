"""Decode steps in batch-size buckets: padding changes no output, and (on CUDA) neither do
captured graphs — greedy and seeded sampling, across bucket edges, under retract and abort.

On the CPU a bucketed engine runs each step eagerly, padded to its bucket: the same arithmetic
a graph replays. On CUDA the bucketed engine captures and replays CUDA graphs.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.app.engine.loop import Engine
from eagletree.app.workers.decode_inputs import DecodeInputBuffers
from eagletree.app.workers.sampler import SamplingMode
from eagletree.app.workers.step_graphs import (
    DecodeStepRunner,
    _no_collection_during_capture,
    bucket_for,
    graph_buckets,
)
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS
from eagletree.domain.request import FinishReason, Request
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_triton
from tests.integration.spec.harness import (
    SIZES,
    SpecModels,
    load_spec_models,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)

BUCKETS = (1, 2, 4, 6)
MAX_NEW = 12


@pytest.fixture(scope="module")
def models_cache(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SpecModels]:
    cache: dict[tuple[str, str, str], SpecModels] = {}

    def get(arch: str, kind: str, device: torch.device) -> SpecModels:
        key = (arch, kind, str(device))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"graphs-{arch}-{kind}")
            cache[key] = load_spec_models(root, arch, kind, device)  # type: ignore[arg-type]
        return cache[key]

    return get


def test_buckets_cover_every_batch_size_up_to_the_maximum() -> None:
    assert graph_buckets(48) == (1, 2, 4, 8, 16, 24, 32, 48)
    assert graph_buckets(5) == (1, 2, 4, 5)
    assert graph_buckets(130) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 130)
    sizes = (0, 1, 3, 4, 5, 8, 9)
    assert [bucket_for(bs, (1, 2, 4, 8)) for bs in sizes] == [None, 1, 4, 4, 8, 8, None]
    with pytest.raises(ValueError, match="max_batch_size"):
        graph_buckets(0)


def _request(request_id: int, row: int, committed: int, **params: float | int) -> Request:
    request = Request(request_id, [3] * (committed + 1), SamplingParams(8, **params), 64)  # type: ignore[arg-type]
    request.admit(row, 0.0)
    request.grow_window(committed + 4)
    request.commit(committed)
    return request


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_garbage_is_collected_before_a_capture_and_not_during_it() -> None:
    """An earlier engine's graphs freed by the collector mid-capture would invalidate it."""
    garbage = _Cyclic()
    freed = weakref.ref(garbage)
    del garbage  # only the collector frees a cycle
    assert gc.isenabled() and freed() is not None
    with _no_collection_during_capture():
        assert freed() is None
        assert not gc.isenabled()
    assert gc.isenabled()


def test_filled_inputs_pad_to_the_padding_row_and_reserve_coins_once() -> None:
    pool = TensorReqToTokenPool(4, 32, "cpu")
    pool.req_to_token.fill_(9)  # stale slot ids everywhere
    buffers = DecodeInputBuffers.for_pool(pool, padded=True)
    assert pool.available_size() == 3  # the padding row is taken for good...
    padding = buffers.padding_row
    assert bool((pool.req_to_token[padding] == 0).all())  # ... and points at slot 0 only
    first = _request(0, 1, 5, temperature=1.0, top_k=3, top_p=0.5, seed=11)
    second = _request(1, 2, 7)
    inputs = buffers.fill([first, second], 4, num_coins=9)
    assert inputs.batch_size == 2 and inputs.padded_size == 4
    assert inputs.rows.tolist() == [1, 2, padding, padding]
    assert inputs.seq_lens.tolist() == [5, 7, 0, 0]
    assert inputs.last_tokens.tolist() == [3, 3, 0, 0]
    sampling = inputs.sampling
    assert sampling.temperature.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert sampling.top_k.tolist() == [3, 0, 0, 0]
    assert sampling.top_p.tolist() == [0.5, 1.0, 1.0, 1.0]
    assert sampling.seeds.tolist() == [11, 0, 0, 0]
    assert sampling.coin_offsets.tolist() == [0, 0, 0, 0]
    assert not sampling.all_greedy
    assert (first.coin_offset, second.coin_offset) == (9, 0)  # greedy requests take no coins
    again = buffers.fill([first], 1, num_coins=9)
    assert again.sampling.coin_offsets.tolist() == [9]
    assert again.rows.data_ptr() == inputs.rows.data_ptr()  # the same device buffers
    with pytest.raises(ValueError, match="capacity"):
        buffers.fill([first], 5, num_coins=1)


def test_device_tokens_are_gathered_at_the_rows_and_given_lengths_replace_the_hosts() -> None:
    pool = TensorReqToTokenPool(8, 32, "cpu")
    buffers = DecodeInputBuffers.for_pool(pool, padded=True, device_tokens=True)
    assert buffers.pending_tokens is not None
    generator = torch.Generator().manual_seed(3)
    table = torch.randint(1, 1000, (pool.size,), generator=generator)
    buffers.set_pending_tokens(torch.arange(pool.size), table)
    rows = torch.randperm(pool.size - 1, generator=generator)[:5].tolist()  # not the padding row
    requests = [_request(i, row, 2 + i) for i, row in enumerate(rows)]  # host token: 3
    inputs = buffers.fill(requests, 6, num_coins=1, lengths=[10, 11, 12, 13, 14])
    assert inputs.last_tokens.tolist() == [*table[rows].tolist(), 0]  # padding keeps 0
    assert inputs.seq_lens.tolist() == [10, 11, 12, 13, 14, 0]
    assert inputs.seq_lens_cpu is not None and inputs.seq_lens_cpu.tolist()[:5] == [
        10,
        11,
        12,
        13,
        14,
    ]
    assert inputs.seq_lens_sum == 60
    buffers.set_pending_tokens(torch.tensor(rows[:2]), torch.tensor([7, 8]))
    again = buffers.fill(requests[:2], 2, num_coins=1)
    assert again.last_tokens.tolist() == [7, 8]
    assert again.seq_lens.tolist() == [2, 3]  # the host's committed lengths by default
    with pytest.raises(ValueError, match="2 lengths for 3 requests"):
        buffers.fill(requests[:3], 4, num_coins=1, lengths=[1, 2])


@pytest.mark.parametrize("padded", [True, False])
def test_a_runner_gathers_device_lengths_and_tokens_inside_its_step(padded: bool) -> None:
    pool = TensorReqToTokenPool(8, 32, "cpu")
    buffers = DecodeInputBuffers.for_pool(
        pool, padded=padded, device_lengths=True, device_tokens=True
    )
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(1, 1000, (pool.size,), generator=generator)
    lengths = torch.randint(1, 30, (pool.size,), generator=generator)
    buffers.set_pending_tokens(torch.arange(pool.size), tokens)
    assert buffers.committed is not None
    buffers.committed.copy_(lengths)  # the padding row's too: a padding row must not read it
    free = [row for row in range(pool.size) if not padded or row != buffers.padding_row]
    rows = [free[i] for i in torch.randperm(len(free), generator=generator)[:3].tolist()]
    requests = [_request(i, row, 2) for i, row in enumerate(rows)]  # host: length 2, token 3
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def step(inputs: object) -> tuple[torch.Tensor, ...]:
        seen.append((inputs.seq_lens.clone(), inputs.last_tokens.clone()))  # type: ignore[attr-defined]
        return (inputs.rows,)  # type: ignore[attr-defined]

    runner = DecodeStepRunner(step, buffers, num_coins=1, buckets=(4,) if padded else ())
    runner.run(requests, exact_lengths=False)
    pad = [0] if padded else []  # a padding row keeps the host's zeros
    ((seq_lens, last_tokens),) = seen
    assert seq_lens.tolist() == lengths[rows].tolist() + pad
    assert last_tokens.tolist() == tokens[rows].tolist() + pad
    filled = buffers.fill(requests, len(requests), num_coins=1, gather=False)
    assert filled.seq_lens.tolist() == [2, 2, 2] and filled.last_tokens.tolist() == [3, 3, 3]
    if not padded:
        with pytest.raises(ValueError, match="no padding row here"):
            buffers.fill(requests, 4, num_coins=1)


def test_a_runner_without_buckets_never_pads() -> None:
    pool = TensorReqToTokenPool(4, 32, "cpu")
    seen: list[int] = []

    def step(inputs: object) -> tuple[torch.Tensor, ...]:
        rows = inputs.rows  # type: ignore[attr-defined]
        seen.append(int(rows.shape[0]))
        return (rows * 2,)

    runner = DecodeStepRunner(step, DecodeInputBuffers.for_pool(pool, padded=False), num_coins=1)
    requests = [_request(i, i, 2) for i in range(3)]
    assert runner.run(requests)[0].tolist() == [0, 2, 4]
    bucketed = DecodeStepRunner(
        step, DecodeInputBuffers.for_pool(pool, padded=True), num_coins=1, buckets=(2, 4)
    )
    assert bucketed.run(requests)[0].tolist() == [0, 2, 4]  # sliced back to the live rows
    assert bucketed.run([])[0].tolist() == []  # idle: eager, unpadded
    assert seen == [3, 4, 0]


@pytest.mark.parametrize("warm_up", [True, False])
def test_a_timed_eager_step_runs_its_repeats_after_one_warm_up_if_asked(warm_up: bool) -> None:
    pool = TensorReqToTokenPool(4, 32, "cpu")
    seen: list[int] = []

    def step(inputs: object) -> tuple[torch.Tensor, ...]:
        rows = inputs.rows  # type: ignore[attr-defined]
        seen.append(int(rows.shape[0]))
        return (rows,)

    buffers = DecodeInputBuffers.for_pool(pool, padded=True)
    runner = DecodeStepRunner(step, buffers, num_coins=1, buckets=(2, 3))
    seconds = runner.time_step(3, SamplingMode.GREEDY, 3, warm_up=warm_up)
    assert seen == [3] * (4 if warm_up else 3)  # every run over the bucket's padding rows
    assert seconds > 0.0


def _run_workload(
    engine: Engine, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
) -> list[tuple[FinishReason | None, list[int]]]:
    """Submit in two waves (batch sizes move across bucket edges) and abort one request."""
    requests = [engine.submit(p, q) for p, q in zip(prompts[:5], params[:5], strict=True)]
    for step in range(1000):
        if step == 3:
            requests += [engine.submit(p, q) for p, q in zip(prompts[5:], params[5:], strict=True)]
        if step == 5:
            engine.abort(requests[1].request_id)
        if not engine.has_work():
            break
        engine.step()
    return [(r.finish_reason, r.output_ids) for r in requests]


def _workload(temperature: float) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = ragged_prompts(SIZES.vocab_size, [3, 7, 1, 12, 5, 9, 4, 2], seed=70)
    params = [
        SamplingParams(MAX_NEW - i % 3, temperature=temperature, top_k=20, seed=100 + i)
        for i in range(len(prompts))
    ]
    return prompts, params


@pytest.mark.parametrize(
    ("config", "draw", "temperature"),
    [
        ((5, 4, 8), False, 0.0),
        ((5, 4, 8), False, 1.0),
        ((3, 1, 4), True, 1.0),
        ((5, 4, 8), True, 1.0),
    ],
    ids=["tree-greedy", "tree-sampled", "drawn-chain-sampled", "drawn-tree-sampled"],
)
@pytest.mark.parametrize(("arch", "kind"), [("llama", "eagle"), ("deepseek-mla", "eagle3")])
def test_bucketed_tree_steps_emit_what_unpadded_steps_emit(
    models_cache: Callable[..., SpecModels],
    device: torch.device,
    arch: str,
    kind: str,
    config: tuple[int, int, int],
    draw: bool,
    temperature: float,
) -> None:
    models = models_cache(arch, kind, device)
    backend = "triton" if device.type == "cuda" else "torch"
    prompts, params = _workload(temperature)
    # a request holds up to 12 + 12 tokens and twice the widest window reserved (the tree's
    # 2 · 20, the chain's 2 · 4): 100 or 48 slots hold about two, so later ones wait and
    # running ones are retracted as their windows grow
    pool = 100 if config[1] > 1 else 48
    eager = speculative_engine(
        models, *config, backend=backend, pool_size=pool, max_running=6, draw_drafts=draw
    )
    expected = _run_workload(eager.engine, prompts, params)
    graphed = speculative_engine(
        models,
        *config,
        draw_drafts=draw,
        backend=backend,
        pool_size=pool,
        max_running=6,
        graph_buckets=BUCKETS,
        use_cuda_graphs=device.type == "cuda",
    )
    free_at_start = graphed.memory.allocator.available_size()
    assert _run_workload(graphed.engine, prompts, params) == expected
    assert graphed.engine.stats.num_retracted > 0
    assert graphed.memory.allocator.available_size() == free_at_start
    runner = graphed.worker.step_runner
    assert runner.num_replays > 0 if device.type == "cuda" else runner.num_graphs == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bucketed_plain_decode_emits_what_unpadded_decode_emits(
    models_cache: Callable[..., SpecModels], device: torch.device, temperature: float
) -> None:
    models = models_cache("llama", "eagle", device)
    backend = "triton" if device.type == "cuda" else "torch"
    prompts, params = _workload(temperature)
    eager = plain_engine(models, backend=backend, pool_size=40, max_running=6)
    expected = _run_workload(eager, prompts, params)
    graphed = plain_engine(
        models,
        backend=backend,
        pool_size=40,
        max_running=6,
        graph_buckets=BUCKETS,
        use_cuda_graphs=device.type == "cuda",
    )
    assert _run_workload(graphed, prompts, params) == expected
    assert graphed.stats.num_retracted > 0


def test_padded_triton_tree_steps_match_unpadded_ones(
    models_cache: Callable[..., SpecModels], device: torch.device
) -> None:
    """The shipped backend under padding: the interpreter on the CPU, compiled on CUDA."""
    requires_triton(device)
    models = models_cache("llama", "eagle", device)
    prompts = _workload(0.0)[0][:3]
    eager = speculative_engine(models, 2, 2, 3, backend="triton", max_running=4)
    padded = speculative_engine(
        models, 2, 2, 3, backend="triton", max_running=4, graph_buckets=(4,)
    )
    expected = [r.output_ids for r in eager.engine.generate(prompts, max_new_tokens=5)]
    assert [r.output_ids for r in padded.engine.generate(prompts, max_new_tokens=5)] == expected


@pytest.mark.parametrize(
    ("shape", "pool_size"), [((3, 2, 5), 100), ((3, 1, 4), 60)], ids=["tree", "chain"]
)
def test_the_triton_draws_walk_and_sample_of_drawn_drafts_sample_what_the_torch_ones_sample(
    models_cache: Callable[..., SpecModels],
    device: torch.device,
    shape: tuple[int, int, int],
    pool_size: int,
) -> None:
    """The one-launch draws and verification of drawn trees in the worker (a chain's in its own
    two launches), and the one-launch inverse-CDF sample of the requests' first tokens, padded
    (and on CUDA graphed), against the torch references: the same seeded samples, retractions
    and an abort."""
    requires_triton(device)
    from eagletree.adapters.kernels.triton.chain_sampling import verify_chain_drawn
    from eagletree.adapters.kernels.triton.draw_children import draw_children, sample_from_probs
    from eagletree.adapters.kernels.triton.tree_sampling import verify_tree_drawn

    models = models_cache("llama", "eagle", device)
    backend = "triton" if device.type == "cuda" else "torch"
    prompts, params = _workload(1.0)
    # a pool that retracts; narrow drafts: the interpreter runs a program per row and draw
    options: dict[str, Any] = {"backend": backend, "pool_size": pool_size, "max_running": 6}
    reference = speculative_engine(models, *shape, draw_drafts=True, **options)
    expected = _run_workload(reference.engine, prompts, params)
    fused = speculative_engine(
        models,
        *shape,
        draw_drafts=True,
        kernels=REFERENCE_KERNELS._replace(
            sample=sample_from_probs,
            draw_children=draw_children,
            verify_drawn=verify_tree_drawn,
            verify_chain=verify_chain_drawn,
        ),
        graph_buckets=BUCKETS,
        use_cuda_graphs=device.type == "cuda",
        **options,
    )
    assert _run_workload(fused.engine, prompts, params) == expected
    assert fused.engine.stats.num_retracted > 0
