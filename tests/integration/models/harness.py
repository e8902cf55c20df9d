"""Test helpers: pools, backends and a tiny scheduler that drives runners through EXTEND/DECODE."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.adapters.models.stack import KVLayout, MHALayout
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from eagletree.ports.attention import AttentionBackend
from eagletree.ports.memory import KVPool
from tests.conftest import requires_triton

BACKENDS = ("torch", "triton")


def skip_unless_backend_runs(backend: str, device: torch.device) -> None:
    if backend == "triton":
        requires_triton(device)


def make_pool(layout: KVLayout, size: int, dtype: torch.dtype, device: torch.device) -> KVPool:
    if isinstance(layout, MHALayout):
        return MHAKVPool(
            size,
            layout.layer_num,
            layout.kv_heads,
            layout.head_dim,
            layout.v_head_dim,
            dtype,
            device,
            TorchRowMover(),
        )
    return MLAKVPool(
        size,
        layout.layer_num,
        layout.kv_lora_rank,
        layout.qk_rope_head_dim,
        dtype,
        device,
        TorchRowMover(),
    )


def make_backend(
    name: str, pool: KVPool, req_to_token_pool: TensorReqToTokenPool
) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend(pool, req_to_token_pool)  # type: ignore[arg-type]
    if name == "flash":  # CUDA with fp16/bf16 only; imported here like the container does
        from eagletree.adapters.attention.flash_backend import FlashAttentionBackend

        return FlashAttentionBackend(pool, req_to_token_pool)  # type: ignore[arg-type]
    return TritonAttentionBackend(pool, req_to_token_pool)  # type: ignore[arg-type]


class Memory:
    """One slot allocator and one req_to_token table, shared by every runner of a test."""

    def __init__(
        self,
        device: torch.device,
        num_slots: int = 256,
        max_requests: int = 8,
        row_width: int = 64,
    ) -> None:
        self.device = device
        self.allocator = DeviceSlotAllocator(num_slots, device)
        self.req_to_token_pool = TensorReqToTokenPool(max_requests, row_width, device)

    def runner_parts(
        self, layout: KVLayout, backend: str, dtype: torch.dtype
    ) -> tuple[KVPool, TensorReqToTokenPool, AttentionBackend]:
        pool = make_pool(layout, self.allocator.size, dtype, self.device)
        return pool, self.req_to_token_pool, make_backend(backend, pool, self.req_to_token_pool)


class Requests:
    """Per-request rows and committed lengths; builds the batches a scheduler would."""

    def __init__(self, memory: Memory, count: int) -> None:
        rows = memory.req_to_token_pool.alloc(count)
        assert rows is not None
        self.memory = memory
        self.rows = rows
        self.lens = [0] * count

    def extend(self, chunks: Sequence[Sequence[int]]) -> ForwardBatch:
        """An EXTEND batch adding ``chunks[i]`` after request i's committed tokens (may be [])."""
        return self._batch(ForwardMode.EXTEND, chunks)

    def decode(self, tokens: Sequence[int]) -> ForwardBatch:
        return self._batch(ForwardMode.DECODE, [[t] for t in tokens])

    def _batch(self, mode: ForwardMode, chunks: Sequence[Sequence[int]]) -> ForwardBatch:
        device, table = self.memory.device, self.memory.req_to_token_pool.req_to_token
        slots = self.memory.allocator.alloc(sum(len(c) for c in chunks))
        assert slots is not None
        positions: list[int] = []
        offset = 0
        for i, chunk in enumerate(chunks):
            start, n = self.lens[i], len(chunk)
            table[self.rows[i], start : start + n] = slots[offset : offset + n].to(torch.int32)
            positions.extend(range(start, start + n))
            offset += n
        seq_lens = torch.tensor(self.lens, dtype=torch.int64)
        extend_lens = torch.tensor([len(c) for c in chunks], dtype=torch.int64)
        for i, chunk in enumerate(chunks):
            self.lens[i] += len(chunk)
        extend = mode is ForwardMode.EXTEND
        return ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(
                [t for c in chunks for t in c], dtype=torch.int64, device=device
            ),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            seq_lens=seq_lens.to(device),
            req_pool_indices=torch.tensor(self.rows, dtype=torch.int64, device=device),
            out_cache_loc=slots,
            extend_lens=extend_lens.to(device) if extend else None,
            seq_lens_cpu=seq_lens,
            seq_lens_sum=int(seq_lens.sum()),
            extend_lens_cpu=extend_lens if extend else None,
        )


def random_prompts(vocab: int, lengths: Sequence[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |ours - reference| / max |reference|: differences relative to the logit scale."""
    scale = reference.abs().max().clamp_min(1e-12)
    return float((ours.double().cpu() - reference.double().cpu()).abs().max() / scale)


def perturb_parameters(module: torch.nn.Module, seed: int, std: float = 0.2) -> None:
    """Random weights for every parameter (norm weights around 1) from a seeded generator, so
    that a missing norm or a swapped projection shows in the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
            base = 1.0 if "norm" in name else 0.0
            param.copy_((base + noise).to(param.dtype))


def chunked_schedule(vocab: int, seed: int) -> list[tuple[str, list[list[int]]]]:
    """Two requests: ragged prefill, a chunk on top of a prefix, then three decode steps."""
    prompts = random_prompts(vocab, [5, 3], seed=seed)
    more = random_prompts(vocab, [5, 4], seed=seed + 1)
    return [
        ("extend", prompts),
        ("extend", [more[0][:2], more[1][:1]]),
        *[("decode", [[more[0][2 + i]], [more[1][1 + i]]]) for i in range(3)],
    ]


def run_against_reference(
    runner: TargetModelRunner,
    memory: Memory,
    reference: Callable[[list[int]], Any],
    schedule: list[tuple[str, list[list[int]]]],
    tolerance: float,
) -> list[tuple[ModelOutput, Any, list[slice], list[slice]]]:
    """Drive ``runner`` through ``schedule``; assert every logit row equals ``reference``'s
    (a transformers model called on a request's whole sequence) within ``tolerance``.

    Returns, per step, (our output, the reference outputs, our row slices, the reference's
    position slices) for further checks.
    """
    requests = Requests(memory, len(schedule[0][1]))
    sequences: list[list[int]] = [[] for _ in requests.rows]
    steps = []
    for mode, chunks in schedule:
        starts = [len(s) for s in sequences]
        if mode == "extend":
            batch = requests.extend(chunks)
        else:
            batch = requests.decode([c[0] for c in chunks])
        out = runner.forward(batch)
        assert out.logits.dtype == out.hidden_states.dtype  # the model's own dtype
        assert out.logits.shape == (batch.num_tokens, runner.vocab_size)
        references, ours, theirs, row = [], [], [], 0
        for i, chunk in enumerate(chunks):
            sequences[i] += chunk
            hf = reference(sequences[i])
            new = slice(starts[i], starts[i] + len(chunk))
            rows = slice(row, row + len(chunk))
            assert relative_error(out.logits[rows], hf.logits[0, new]) <= tolerance, (mode, i)
            references.append(hf)
            ours.append(rows)
            theirs.append(new)
            row += len(chunk)
        steps.append((out, references, ours, theirs))
    return steps
