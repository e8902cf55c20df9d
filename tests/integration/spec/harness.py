"""Speculative test harness: tiny random target + draft checkpoints and engines with and without
speculation over them (pools, backends and runners built directly from the adapters, so the
GPU machine needs neither pydantic nor dependency-injector)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.draft_loading import DraftKind, DraftModel
from eagletree.adapters.models.loading import load_models
from eagletree.adapters.models.model_building import TargetModel
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch, ModelSizes
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.scheduler import PrefillStep
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.app.workers.shapes.policy import ShapePolicy
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.domain.draft_shape import DraftShape, reserved_slots
from eagletree.domain.request import Request
from eagletree.domain.tree import TreeMaskMode
from eagletree.ports.model import DraftRunner, ModelRunner
from tests.integration.models.harness import make_backend, make_pool

# vocab small enough that a random draft's top-k sometimes holds the target's token
SIZES = ModelSizes(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    draft_vocab_size=64,
)
WEIGHT_STD = 0.15  # spreads the target's logits, so that no argmax is a near tie
CONTEXT_LEN = 96


@dataclass(frozen=True, slots=True)
class SpecModels:
    """A loaded target and its draft head(s), shared by every engine of a test module."""

    arch: Arch
    kind: DraftKind
    target: TargetModel
    drafts: list[DraftModel]
    device: torch.device
    dtype: torch.dtype


def load_spec_models(
    root: Path,
    arch: Arch,
    kind: DraftKind,
    device: torch.device,
    *,
    sizes: ModelSizes = SIZES,
    seed: int = 0,
    std: float = WEIGHT_STD,
    dtype: torch.dtype = torch.float32,
) -> SpecModels:
    target_dir, draft_dir = write_random_checkpoint(
        root, arch, kind, seed=seed, sizes=sizes, dtype=dtype, std=std
    )
    loaded = load_models(target_dir, draft_dir, kind, dtype, device)
    return SpecModels(arch, kind, loaded.target, list(loaded.drafts), device, dtype)


@dataclass(frozen=True, slots=True)
class EngineMemory:
    allocator: DeviceSlotAllocator
    req_to_token_pool: TensorReqToTokenPool


def _memory(device: torch.device, pool_size: int, max_running: int, row_width: int) -> EngineMemory:
    return EngineMemory(
        DeviceSlotAllocator(pool_size, device, debug_checks=True),
        TensorReqToTokenPool(max_running, row_width, device),
    )


def _target_runner(models: SpecModels, memory: EngineMemory, backend: str) -> TargetModelRunner:
    pool = make_pool(models.target.kv_layout, memory.allocator.size, models.dtype, models.device)
    return TargetModelRunner(
        models.target,
        pool,
        memory.req_to_token_pool,
        make_backend(backend, pool, memory.req_to_token_pool),
    )


def draft_runner(
    models: SpecModels, memory: EngineMemory, backend: str, index: int = 0
) -> DraftModelRunner:
    """A runner of draft head ``index`` over its own pool of the allocator's size."""
    draft = models.drafts[index]
    pool = make_pool(draft.kv_layout, memory.allocator.size, models.dtype, models.device)
    return DraftModelRunner(
        draft,
        pool,
        memory.req_to_token_pool,
        make_backend(backend, pool, memory.req_to_token_pool),
    )


def plain_engine(
    models: SpecModels,
    *,
    backend: str = "torch",
    pool_size: int = 2048,
    max_running: int = 8,
    context_len: int = CONTEXT_LEN,
    eos_token_ids: Collection[int] = (),
    graph_buckets: Sequence[int] = (),
    use_cuda_graphs: bool = False,
    overlap: bool = False,
    run_ahead: bool | None = None,
    prefill_step: PrefillStep = "with_decode",
) -> Engine:
    """A non-speculative engine; with ``graph_buckets`` its decode steps run padded (from CUDA
    graphs with ``use_cuda_graphs``), over one req_to_token row more for the padding.
    ``overlap``: the engine keeps one step in flight; ``run_ahead`` (default: ``overlap``): the
    worker keeps its pending tokens on the device, which overlap needs; ``prefill_step``:
    where a plan's prefills run (the scheduler's)."""
    rows = max_running + (1 if graph_buckets else 0)
    memory = _memory(models.device, pool_size, rows, context_len + 8)
    runner = _target_runner(models, memory, backend)
    worker = NonSpeculativeWorker(
        runner,
        graph_buckets=graph_buckets,
        use_cuda_graphs=use_cuda_graphs,
        run_ahead=overlap if run_ahead is None else run_ahead,
    )
    return Engine(
        worker,
        memory.allocator,
        memory.req_to_token_pool,
        vocab_size=runner.vocab_size,
        max_context_len=context_len,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
        overlap=overlap,
        prefill_step=prefill_step,
    )


@dataclass(frozen=True, slots=True)
class SpecEngine:
    engine: Engine
    worker: EagleWorkerV2
    target: ModelRunner
    draft: DraftRunner
    memory: EngineMemory


def speculative_engine(
    models: SpecModels,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    *,
    backend: str = "torch",
    pool_size: int = 4096,
    max_running: int = 8,
    context_len: int = CONTEXT_LEN,
    eos_token_ids: Collection[int] = (),
    wrap_draft: Callable[[DraftModelRunner], DraftRunner] | None = None,
    wrap_target: Callable[[TargetModelRunner], ModelRunner] | None = None,
    mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
    graph_buckets: Sequence[int] = (),
    use_cuda_graphs: bool = False,
    overlap: bool = False,
    prefill_step: PrefillStep = "with_decode",
    policy: ShapePolicy | None = None,
    kernels: StepKernels = REFERENCE_KERNELS,
    draw_drafts: bool = False,
) -> SpecEngine:
    """An engine running ``EagleWorkerV2`` with (S, k, N) = (num_steps, topk, num_draft_tokens);
    ``graph_buckets``, ``use_cuda_graphs`` and ``prefill_step`` as ``plain_engine``'s;
    ``overlap``: the engine keeps one step in flight; ``policy``: the worker's shape policy
    (its first shape must be (S, k, N)); ``kernels``: the step's fused functions;
    ``draw_drafts``: chains draw their sampling requests' drafts."""
    shapes = [DraftShape(num_steps, topk, num_draft_tokens)]
    if policy is not None:
        shapes = list(policy.shapes)
    reserve = reserved_slots(shapes)
    rows = max_running + (1 if graph_buckets else 0)
    memory = _memory(models.device, pool_size, rows, context_len + reserve + 4)
    real_target = _target_runner(models, memory, backend)
    target: ModelRunner = real_target if wrap_target is None else wrap_target(real_target)
    real_draft = draft_runner(models, memory, backend)
    draft: DraftRunner = real_draft if wrap_draft is None else wrap_draft(real_draft)
    worker = EagleWorkerV2(
        target,
        draft,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        draft_hidden_size=real_draft.hidden_size,
        use_aux_hidden=models.kind == "eagle3",
        mask_mode=mask_mode,
        graph_buckets=graph_buckets,
        use_cuda_graphs=use_cuda_graphs,
        policy=policy,
        kernels=kernels,
        draw_drafts=draw_drafts,
    )
    engine = Engine(
        worker,
        memory.allocator,
        memory.req_to_token_pool,
        vocab_size=target.vocab_size,
        max_context_len=context_len,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
        overlap=overlap,
        prefill_step=prefill_step,
    )
    return SpecEngine(engine, worker, target, draft, memory)


def ragged_prompts(vocab: int, lengths: Sequence[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def greedy_outputs(
    engine: Engine, prompts: Sequence[Sequence[int]], max_new: int
) -> list[list[int]]:
    return [r.output_ids for r in engine.generate(prompts, max_new_tokens=max_new)]


class RecordingPolicy:
    """A test shape policy's base: its shapes, how often it chose each, every path it
    observed as (shape, request id, path) and every step time as (shape, batch size, sampled,
    seconds, catch-up); a subclass says which shape each step drafts (``pick``)."""

    observes = True

    def __init__(self, shapes: Sequence[DraftShape]) -> None:
        self.shapes = tuple(shapes)
        self.chosen: Counter[DraftShape] = Counter()
        self.observed: list[tuple[DraftShape, int, list[int]]] = []
        self.timed: list[tuple[DraftShape, int, bool, float, bool]] = []

    def pick(self, decode: Sequence[Request]) -> DraftShape:
        raise NotImplementedError

    def choose(self, decode: Sequence[Request]) -> DraftShape:
        shape = self.pick(decode)
        self.chosen[shape] += 1
        return shape

    def observe(
        self, shape: DraftShape, requests: Sequence[Request], paths: Sequence[Sequence[int]]
    ) -> None:
        for request, path in zip(requests, paths, strict=True):
            self.observed.append((shape, request.request_id, list(path)))

    def observe_time(
        self,
        shape: DraftShape,
        batch_size: int,
        sampled: bool,
        seconds: float,
        *,
        catch_up: bool = False,
    ) -> None:
        self.timed.append((shape, batch_size, sampled, seconds, catch_up))
