"""Engines for the EagleWorkerV1 tests (also used by the prefill-step tests): paged
pools, the v1 engine, and v1 and v2 engines whose draft is an oracle of the target's
greedy continuation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.stack import KVLayout, MHALayout
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.scheduler import PrefillStep
from eagletree.app.workers.eagle_v1 import EagleWorkerV1
from eagletree.ports.memory import KVPool
from eagletree.ports.model import DraftRunner
from tests.integration.models.harness import make_backend
from tests.integration.spec.harness import (
    CONTEXT_LEN,
    SIZES,
    SpecModels,
    greedy_outputs,
    plain_engine,
    ragged_prompts,
    speculative_engine,
)
from tests.integration.spec.oracle_draft import OracleDraft

CONFIGS = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (4, 8, 32)]  # (S, k, N)
PROMPT_LENGTHS = [3, 7, 1, 12, 5, 9]
MAX_NEW = 16

ModelCache = Callable[..., SpecModels]


def prompts_for(batch_size: int, seed: int) -> list[list[int]]:
    lengths = [PROMPT_LENGTHS[(seed + i) % len(PROMPT_LENGTHS)] for i in range(batch_size)]
    return ragged_prompts(SIZES.vocab_size, lengths, seed)


def make_pool(layout: KVLayout, size: int, models: SpecModels, page_size: int) -> KVPool:
    if isinstance(layout, MHALayout):
        return MHAKVPool(
            size,
            layout.layer_num,
            layout.kv_heads,
            layout.head_dim,
            layout.v_head_dim,
            models.dtype,
            models.device,
            TorchRowMover(),
            page_size=page_size,
        )
    return MLAKVPool(
        size,
        layout.layer_num,
        layout.kv_lora_rank,
        layout.qk_rope_head_dim,
        models.dtype,
        models.device,
        TorchRowMover(),
        page_size=page_size,
    )


@dataclass(frozen=True, slots=True)
class V1Engine:
    engine: Engine
    worker: EagleWorkerV1
    target: TargetModelRunner
    allocator: DeviceSlotAllocator
    table: TensorReqToTokenPool


def v1_engine(
    models: SpecModels,
    config: tuple[int, int, int],
    *,
    page_size: int = 1,
    pool_size: int = 4096,
    max_running: int = 8,
    eos_token_ids: Sequence[int] = (),
    wrap_draft: Callable[[DraftModelRunner], DraftRunner] | None = None,
    backend: str = "torch",
    prefill_step: PrefillStep = "with_decode",
) -> V1Engine:
    num_steps, topk, n = config
    allocator = DeviceSlotAllocator(pool_size, models.device, debug_checks=True)
    reserve = max(num_steps * topk, n)
    table = TensorReqToTokenPool(max_running, CONTEXT_LEN + reserve + 4, models.device)
    target_pool = make_pool(models.target.kv_layout, pool_size, models, page_size)
    target = TargetModelRunner(
        models.target, target_pool, table, make_backend(backend, target_pool, table)
    )
    head = models.drafts[0]
    draft_pool = make_pool(head.kv_layout, pool_size, models, page_size)
    real_draft = DraftModelRunner(
        head,
        draft_pool,
        table,
        make_backend(backend, draft_pool, table),
    )
    draft: DraftRunner = real_draft if wrap_draft is None else wrap_draft(real_draft)
    worker = EagleWorkerV1(
        target,
        draft,
        allocator=allocator,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=n,
        draft_hidden_size=real_draft.hidden_size,
        use_aux_hidden=models.kind == "eagle3",
    )
    engine = Engine(
        worker,
        allocator,
        table,
        vocab_size=target.vocab_size,
        max_context_len=CONTEXT_LEN,
        max_running_requests=max_running,
        eos_token_ids=eos_token_ids,
        prefill_step=prefill_step,
    )
    return V1Engine(engine, worker, target, allocator, table)


def oracle_wrapper(
    models: SpecModels,
    prompts: Sequence[Sequence[int]],
    topk: int,
    max_new: int,
    engine_of: Callable[[], Engine],
    seed: int,
) -> tuple[Callable[[DraftModelRunner], DraftRunner], list[list[int]]]:
    """A ``wrap_draft`` that turns the draft into the oracle of ``prompts``' greedy
    continuations (``max_new`` tokens, also returned), for the engine ``engine_of()``."""
    continuation = greedy_outputs(plain_engine(models), prompts, max_new + 10)
    sequences = {tuple(p): [*p, *out] for p, out in zip(prompts, continuation, strict=True)}

    def sequence_of_row(row: int) -> list[int]:
        [owner] = [r for r in engine_of().scheduler.running if r.row == row]
        return sequences[owner.prompt_ids]

    def wrap(draft: DraftModelRunner) -> DraftRunner:
        return OracleDraft(draft, sequence_of_row, topk, seed=seed)

    return wrap, [out[:max_new] for out in continuation]


def oracle_v1_engine(
    models: SpecModels,
    config: tuple[int, int, int],
    prompts: Sequence[Sequence[int]],
    max_new: int,
    **options: object,
) -> tuple[V1Engine, list[list[int]]]:
    holder: list[V1Engine] = []
    wrap, expected = oracle_wrapper(
        models, prompts, config[1], max_new, lambda: holder[0].engine, seed=sum(config)
    )
    holder.append(v1_engine(models, config, wrap_draft=wrap, **options))  # type: ignore[arg-type]
    return holder[0], expected


def oracle_v2_engine(
    models: SpecModels, config: tuple[int, int, int], prompts: Sequence[Sequence[int]]
) -> Engine:
    holder: list[Engine] = []
    wrap, _ = oracle_wrapper(
        models, prompts, config[1], MAX_NEW, lambda: holder[0], seed=sum(config)
    )
    holder.append(speculative_engine(models, *config, wrap_draft=wrap).engine)
    return holder[0]
