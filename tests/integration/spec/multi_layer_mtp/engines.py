"""Engines over several MTP layers for the MultiLayerEagleWorkerV2 tests (also used
by the overlap and prefill-step tests): each layer a runner over its own KV pool,
optionally an oracle of the target's greedy continuation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.scheduler import PrefillStep
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from eagletree.ports.memory import KVPool
from eagletree.ports.model import DraftRunner
from tests.batch_widths import fixed_width
from tests.integration.models.harness import make_backend, make_pool
from tests.integration.spec.harness import (
    CONTEXT_LEN,
    SIZES,
    SpecModels,
    greedy_outputs,
    plain_engine,
    ragged_prompts,
)
from tests.integration.spec.wrapped_draft_runner import WrappedDraftRunner

NUM_LAYERS = {"deepseek-mla": 3, "llama": 2}
WRONG_RATE = 0.2  # the layer oracle's share of deliberately wrong drafts
MAX_NEW = 16

ModelCache = Callable[..., SpecModels]


class LayerOracle(WrappedDraftRunner):
    """MTP layer ``layer`` as a DraftRunner that knows the target's greedy continuation.

    The real forward runs (its KV is what the pool gets, untouched); then a logits row whose
    input token is the true token ``layer + 1`` places after its position proposes the true
    token after that, except for a seeded ``WRONG_RATE`` share that proposes a wrong one, so
    acceptance is deep but not always full and the boundary rows see wrong drafts.
    """

    def __init__(
        self,
        inner: DraftModelRunner,
        layer: int,
        sequence_of_row: Callable[[int], Sequence[int]],
        seed: int,
    ) -> None:
        super().__init__(inner)
        self._layer = layer
        self._sequence_of_row = sequence_of_row
        self._generator = torch.Generator().manual_seed(seed)

    def forward(
        self,
        batch: ForwardBatch,
        hidden_states: torch.Tensor,
        logits_rows: torch.Tensor | None = None,
    ) -> ModelOutput:
        out = self._inner.forward(batch, hidden_states, logits_rows)
        assert logits_rows is not None
        if batch.mode is ForwardMode.EXTEND:  # prefill, or a step with a short request
            assert batch.extend_lens is not None
            owners = torch.repeat_interleave(batch.req_pool_indices, batch.extend_lens).tolist()
        else:  # the fixed-width draft extend: S − 1 + N rows per request
            assert batch.mode is ForwardMode.DRAFT_EXTEND
            width = fixed_width(batch)
            owners = torch.repeat_interleave(batch.req_pool_indices, width).tolist()
        ids, positions = batch.input_ids.tolist(), batch.positions.tolist()
        logits = out.logits.clone()
        for i, row in enumerate(logits_rows.tolist()):
            sequence = self._sequence_of_row(owners[row])
            read = positions[row] + self._layer + 1  # the index of the token this row reads
            if read + 1 < len(sequence) and ids[row] == sequence[read]:
                token = sequence[read + 1]
                if float(torch.rand(1, generator=self._generator)) < WRONG_RATE:
                    token = (token + 1) % self.vocab_size
                logits[i] = -20.0
                logits[i, token] = 20.0
        return ModelOutput(logits=logits, hidden_states=out.hidden_states)


@dataclass(frozen=True, slots=True)
class MTPEngine:
    engine: Engine
    worker: MultiLayerEagleWorkerV2
    target: TargetModelRunner
    layer_pools: list[KVPool]  # the pool each layer should write
    drafts: list[DraftRunner]  # what the worker runs, layer by layer
    allocator: DeviceSlotAllocator
    table: TensorReqToTokenPool


def mtp_engine(
    models: SpecModels,
    num_steps: int,
    *,
    prompts: Sequence[Sequence[int]] = (),
    own_tables: bool = True,
    first_runners_pool: bool = False,
    pool_size: int = 2048,
    max_running: int = 8,
    backend: str = "torch",
    graph_buckets: Sequence[int] = (),
    use_cuda_graphs: bool = False,
    overlap: bool = False,
    prefill_step: PrefillStep = "with_decode",
) -> MTPEngine:
    """An engine over ``num_steps`` MTP layers, each runner with its own KV pool (and its own
    req_to_token pool when ``own_tables``). With ``prompts`` the layers are oracles of their
    greedy continuations. ``first_runners_pool`` wires every layer to layer 0's pool, table
    and backend — upstream's bug, for showing that the regression check catches it.
    ``overlap``: the engine keeps one step in flight; ``prefill_step``: the scheduler's."""
    n = num_steps + 1
    allocator = DeviceSlotAllocator(pool_size, models.device, debug_checks=True)
    width = CONTEXT_LEN + 2 * n + 4
    rows = max_running + (1 if graph_buckets else 0)  # the padding row of bucketed steps
    table = TensorReqToTokenPool(rows, width, models.device)
    target_pool = make_pool(models.target.kv_layout, pool_size, models.dtype, models.device)
    target = TargetModelRunner(
        models.target, target_pool, table, make_backend(backend, target_pool, table)
    )
    pools: list[KVPool] = []
    runners: list[DraftModelRunner] = []
    for i in range(num_steps):
        layer = models.drafts[i]
        pools.append(make_pool(layer.kv_layout, pool_size, models.dtype, models.device))
        own = TensorReqToTokenPool(rows, width, models.device) if own_tables else table
        if first_runners_pool and i > 0:
            pool, own = runners[0].kv_pool, runners[0].req_to_token_pool  # type: ignore[assignment]
            attention = runners[0].attention_backend
        else:
            pool, attention = pools[i], make_backend(backend, pools[i], own)
        runners.append(DraftModelRunner(layer, pool, own, attention))
    drafts: list[DraftRunner] = list(runners)
    holder: list[Engine] = []
    if prompts:
        continuation = greedy_outputs(plain_engine(models), prompts, 3 * MAX_NEW)
        sequences = {tuple(p): [*p, *c] for p, c in zip(prompts, continuation, strict=True)}

        def sequence_of_row(row: int) -> list[int]:
            [owner] = [r for r in holder[0].scheduler.running if r.row == row]
            return sequences[owner.prompt_ids]

        drafts = [LayerOracle(r, i, sequence_of_row, seed=i) for i, r in enumerate(runners)]
    worker = MultiLayerEagleWorkerV2(
        target,
        drafts,
        num_steps=num_steps,
        num_draft_tokens=n,
        draft_hidden_size=target.hidden_size,
        graph_buckets=graph_buckets,
        use_cuda_graphs=use_cuda_graphs,
    )
    holder.append(
        Engine(
            worker,
            allocator,
            table,
            vocab_size=target.vocab_size,
            max_context_len=CONTEXT_LEN,
            max_running_requests=max_running,
            overlap=overlap,
            prefill_step=prefill_step,
        )
    )
    return MTPEngine(holder[0], worker, target, pools, drafts, allocator, table)


def prompts_for(lengths: Sequence[int], seed: int) -> list[list[int]]:
    return ragged_prompts(SIZES.vocab_size, lengths, seed)
