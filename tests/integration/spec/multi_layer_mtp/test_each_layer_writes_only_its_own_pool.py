"""The regression test for upstream's per-step pool bug: step i runs runner i over
runner i's own pools, so each layer's pool holds exactly that layer's KV, equal to a
clean recomputation, and no other pool is written."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.domain.sampling import SamplingParams
from eagletree.ports.attention import AttentionBackend
from eagletree.ports.memory import KVPool
from tests.integration.models.harness import Memory, Requests, make_backend, make_pool
from tests.integration.spec.harness import SpecModels
from tests.integration.spec.multi_layer_mtp.engines import (
    MAX_NEW,
    NUM_LAYERS,
    ModelCache,
    MTPEngine,
    mtp_engine,
    prompts_for,
)

# Every KV row starts as this; finite, because the reference attention multiplies masked-out
# rows by an exact 0 (NaN would leak through). No layer computes it by chance.
POISON = 12345.0


def clean_kv(
    models: SpecModels, num_steps: int, tokens: Sequence[int], committed: int
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """KV rows of the target (positions [0, L)) and of MTP layer i (positions [0, L − i))
    computed from scratch over the true ``tokens`` (L = ``committed``; ``tokens[L]`` is the
    pending bonus): layer i at position p reads token p + i + 1 and layer i − 1's output there.
    Returns per-buffer tensors, in each pool's ``buffers()`` order."""
    memory = Memory(models.device, num_slots=(num_steps + 1) * (committed + 1), row_width=128)

    def fresh(layout: object) -> tuple[KVPool, AttentionBackend]:
        pool = make_pool(layout, memory.allocator.size, models.dtype, models.device)  # type: ignore[arg-type]
        return pool, make_backend("torch", pool, memory.req_to_token_pool)

    pool, backend = fresh(models.target.kv_layout)
    target = TargetModelRunner(models.target, pool, memory.req_to_token_pool, backend)
    batch = Requests(memory, 1).extend([tokens[:committed]])
    hidden = target.forward(batch).hidden_states
    target_rows = [buf[batch.out_cache_loc] for buf in pool.buffers()]
    layer_rows: list[list[torch.Tensor]] = []
    for i in range(num_steps):
        pool, backend = fresh(models.drafts[i].kv_layout)
        runner = DraftModelRunner(models.drafts[i], pool, memory.req_to_token_pool, backend)
        batch = Requests(memory, 1).extend([tokens[i + 1 : committed + 1]])
        hidden = runner.forward(batch, hidden[: committed - i]).hidden_states
        layer_rows.append([buf[batch.out_cache_loc] for buf in pool.buffers()])
    return target_rows, layer_rows


def written_slots(pool: KVPool) -> set[int]:
    """Slots whose row no longer holds only the poison in some buffer of ``pool``."""
    first = pool.buffers()[0]
    written = torch.zeros(first.shape[0], dtype=torch.bool, device=first.device)
    for buf in pool.buffers():
        written |= buf.ne(POISON).flatten(1).any(dim=1)
    return set(written.nonzero().flatten().tolist())


def pool_problems(mtp: MTPEngine, models: SpecModels, ends: dict[int, int]) -> list[str]:
    """What is wrong with the pools after a run that started from poisoned pools.

    ``ends[request_id]``: the end of the columns the request's last step wrote (its committed
    length before that step + N). Every pool — the target's and each layer's — must have
    written exactly those columns' slots, and hold at the committed positions what a clean
    recomputation of its own model gives."""
    problems: list[str] = []
    running = mtp.engine.scheduler.running
    expected: set[int] = set()
    for request in running:
        assert request.row is not None
        expected |= set(mtp.table.req_to_token[request.row, : ends[request.request_id]].tolist())
    named = [("target", mtp.target.kv_pool)] + [
        (f"MTP layer {i}", pool) for i, pool in enumerate(mtp.layer_pools)
    ]
    for name, pool in named:
        written = written_slots(pool)
        if written != expected:
            problems.append(
                f"{name}: {len(written - expected)} unexpected and "
                f"{len(expected - written)} missing written slots"
            )
    for request in running:
        assert request.row is not None
        length = request.committed_len
        target_rows, layer_rows = clean_kv(models, len(mtp.layer_pools), request.all_ids, length)
        checks = [("target", mtp.target.kv_pool, target_rows, length)] + [
            (f"MTP layer {i}", pool, rows, length - i)
            for i, (pool, rows) in enumerate(zip(mtp.layer_pools, layer_rows, strict=True))
        ]
        for name, pool, rows, count in checks:
            slots = mtp.table.req_to_token[request.row, :count].long()
            for ours, clean in zip(pool.buffers(), rows, strict=True):
                if not torch.allclose(ours[slots], clean, rtol=1e-4, atol=1e-5):
                    problems.append(f"{name}: request {request.request_id} KV differs")
    return problems


def run_from_poisoned_pools(mtp: MTPEngine, prompts: Sequence[Sequence[int]]) -> dict[int, int]:
    """Poison every pool, run six steps; returns each request's last written column."""
    for pool in [mtp.target.kv_pool, *mtp.layer_pools]:
        for buf in pool.buffers():
            buf.fill_(POISON)
    for prompt in prompts:
        mtp.engine.submit(prompt, SamplingParams(max_new_tokens=3 * MAX_NEW))
    ends: dict[int, int] = {}
    for _ in range(6):
        ends = {
            r.request_id: r.committed_len + mtp.worker.shape.num_draft_tokens
            for r in mtp.engine.scheduler.running
        }
        mtp.engine.step()
    assert len(mtp.engine.scheduler.running) == len(prompts)
    return ends


@pytest.mark.parametrize("arch", ["deepseek-mla", "llama"])
def test_each_mtp_layer_writes_only_its_own_pool_and_its_kv_equals_a_clean_recomputation(
    mtp_models: ModelCache, arch: str, device: torch.device
) -> None:
    """Upstream PR #22954: every draft step used the first runner's token pool."""
    models = mtp_models(arch, device)
    num_steps = NUM_LAYERS[arch]
    prompts = prompts_for([1, 4, 9], seed=5)  # the 1-token prompt starts shorter than S − 1
    mtp = mtp_engine(models, num_steps, prompts=prompts)
    ends = run_from_poisoned_pools(mtp, prompts)
    stats = mtp.engine.stats
    assert pool_problems(mtp, models, ends) == []
    accepted = [n for r in mtp.engine.scheduler.running for n in r.emitted_per_step]
    assert max(accepted) > 1 and min(accepted) <= num_steps  # deep and partial acceptance
    assert stats.num_steps == 6


def test_the_regression_check_catches_layers_that_share_the_first_runners_pool(
    mtp_models: ModelCache,
) -> None:
    models = mtp_models("deepseek-mla")
    prompts = prompts_for([1, 4, 9], seed=5)
    mtp = mtp_engine(models, 3, prompts=prompts, first_runners_pool=True)
    ends = run_from_poisoned_pools(mtp, prompts)
    problems = pool_problems(mtp, models, ends)
    assert any(p.startswith("MTP layer 1: 0 unexpected and") for p in problems)
    assert any(p.startswith("MTP layer 0: request") for p in problems)  # overwritten by 1, 2
