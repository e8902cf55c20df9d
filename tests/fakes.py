"""Fakes for app tests: a deterministic model runner that really uses its KV pool.

``FakeRunner`` writes one integer "KV row" per new token at ``out_cache_loc`` and computes each
token's logits from the sum of the KV rows its request's req_to_token row points at (prefix and
itself). A slot that the scheduler handed to two requests, a stale row, a wrong position or a
wrong ``seq_lens`` changes the logits, so comparing with ``reference_logits`` — the same maths
on the token list alone — checks the scheduler's slot bookkeeping end to end. Integer
arithmetic makes the comparison exact whatever the batch composition.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.engine.loop import Engine
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.domain.batch import ForwardBatch, ForwardMode
from eagletree.domain.kv_geometry import KVGeometry
from eagletree.domain.kv_move import move_rows_reference
from eagletree.domain.model_output import ModelOutput

if TYPE_CHECKING:
    from eagletree.ports.memory import TokenSlotAllocator
    from eagletree.ports.model import ModelRunner

_MODULUS = 97  # keeps the integer hidden state small, and the greedy walk varied
_LOGIT_SCALE = 1.0 / 64.0  # spreads sampling over several tokens


class FakeKVPool:
    """One int64 buffer (size + 1, dim): the "KV row" of each slot; row 0 is the dummy."""

    def __init__(self, size: int, dim: int, device: torch.device | str) -> None:
        self.geometry = KVGeometry(size, 1, 1, torch.int64, torch.device(device))
        self.buffer = torch.zeros(size + 1, dim, dtype=torch.int64, device=device)

    def buffers(self) -> list[torch.Tensor]:
        return [self.buffer]

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        move_rows_reference([self.buffer], tgt_loc, src_loc)


class FakeAttentionBackend:
    """The fake computes its own "attention"; this only records that metadata was planned."""

    def __init__(self) -> None:
        self.num_planned = 0

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.num_planned += 1

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        layer: object,
        batch: ForwardBatch,
        save_kv: bool = True,
    ) -> torch.Tensor:
        raise NotImplementedError("FakeRunner does not run attention layers")


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    mode: ForwardMode
    batch_size: int
    num_tokens: int


class FakeRunner:
    """A ModelRunner over a FakeKVPool and a real TensorReqToTokenPool; records its forwards."""

    HOST_STAND_IN = True  # it computes on the host: exempt from the sync tripwire

    def __init__(
        self,
        vocab_size: int = 32,
        max_requests: int = 8,
        row_width: int = 64,
        pool_size: int = 512,
        device: torch.device | str = "cpu",
        seed: int = 0,
        dim: int = 8,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self._vocab_size = vocab_size
        self._dim = dim
        self._device = torch.device(device)
        # key_embedding, query_embedding: (V, dim); lm_head: (dim, V); small integers
        self.key_embedding = torch.randint(-4, 5, (vocab_size, dim), generator=generator)
        self.query_embedding = torch.randint(1, 6, (vocab_size, dim), generator=generator)
        self.lm_head = torch.randint(-3, 4, (dim, vocab_size), generator=generator)
        self._kv_pool = FakeKVPool(pool_size, dim, self._device)
        self._req_to_token_pool = TensorReqToTokenPool(max_requests, row_width, self._device)
        self._attention = FakeAttentionBackend()
        self.records: list[ForwardRecord] = []

    # -- ModelRunner ---------------------------------------------------------------------------

    @property
    def kv_pool(self) -> FakeKVPool:
        return self._kv_pool

    @property
    def req_to_token_pool(self) -> TensorReqToTokenPool:
        return self._req_to_token_pool

    @property
    def attention_backend(self) -> FakeAttentionBackend:
        return self._attention

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def hidden_size(self) -> int:
        return self._dim

    def forward(self, batch: ForwardBatch, logits_rows: torch.Tensor | None = None) -> ModelOutput:
        assert batch.mode in (ForwardMode.EXTEND, ForwardMode.DECODE), batch.mode
        self._attention.init_forward_metadata(batch)
        self.records.append(ForwardRecord(batch.mode, batch.batch_size, batch.num_tokens))
        slots = batch.out_cache_loc.cpu()
        size = self._kv_pool.geometry.size
        assert bool((slots >= 1).all()) and bool((slots <= size).all()), slots
        assert len(set(slots.tolist())) == slots.numel(), "two new tokens share a KV slot"
        input_ids, positions = batch.input_ids.cpu(), batch.positions.cpu()
        self._kv_pool.buffer[batch.out_cache_loc] = self._kv_rows(input_ids, positions).to(
            self._device
        )
        if batch.mode is ForwardMode.DECODE:
            new_lens = torch.ones_like(batch.seq_lens.cpu())
        else:
            assert batch.extend_lens is not None
            new_lens = batch.extend_lens.cpu()
        contexts = []  # per token: Σ of the KV rows at its request's positions 0..its own
        table = self._req_to_token_pool.req_to_token.cpu()
        buffer = self._kv_pool.buffer.cpu()
        rows, seq_lens = batch.req_pool_indices.cpu().tolist(), batch.seq_lens.cpu().tolist()
        token = 0
        for row, seq_len, new_len in zip(rows, seq_lens, new_lens.tolist(), strict=True):
            assert int(positions[token]) == seq_len, "the first new token is not at seq_len"
            row_slots = table[row, : seq_len + new_len].long()
            contexts.append(torch.cumsum(buffer[row_slots], dim=0)[seq_len:])
            token += new_len
        hidden = self._hidden(torch.cat(contexts), input_ids)
        selected = hidden if logits_rows is None else hidden[logits_rows.cpu()]
        logits = (selected @ self.lm_head).float() * _LOGIT_SCALE
        return ModelOutput(logits=logits.to(self._device), hidden_states=hidden.float())

    # -- the same maths on token lists ---------------------------------------------------------

    def reference_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """(V,) float32 logits after ``tokens`` — what ``forward`` must give for the last one."""
        ids = torch.tensor(tokens, dtype=torch.int64)
        context = self._kv_rows(ids, torch.arange(len(tokens))).sum(dim=0, keepdim=True)
        hidden = self._hidden(context, ids[-1:])
        return ((hidden @ self.lm_head).float() * _LOGIT_SCALE)[0]

    def greedy_reference(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        tokens, output = list(prompt), []
        for _ in range(max_new_tokens):
            next_token = int(self.reference_logits(tokens).argmax())
            tokens.append(next_token)
            output.append(next_token)
        return output

    def _kv_rows(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # (num_tokens, dim) int64: depends on the token and on its position
        return self.key_embedding[ids] * (positions % 3 + 1).unsqueeze(1) + positions.unsqueeze(1)

    def _hidden(self, contexts: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return (contexts * self.query_embedding[ids]) % _MODULUS - _MODULUS // 2


def fake_engine_parts(
    pool_size: int = 512,
    max_requests: int = 8,
    row_width: int = 64,
    vocab_size: int = 32,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[FakeRunner, DeviceSlotAllocator]:
    """A FakeRunner and the allocator of its pool (double frees raise: checks are on)."""
    runner = FakeRunner(
        vocab_size=vocab_size,
        max_requests=max_requests,
        row_width=row_width,
        pool_size=pool_size,
        seed=seed,
        device=device,
    )
    return runner, DeviceSlotAllocator(pool_size, device, debug_checks=True)


def plain_engine(
    runner: ModelRunner,
    allocator: TokenSlotAllocator,
    *,
    max_context_len: int,
    max_running_requests: int,
    eos_token_ids: Collection[int] = (),
) -> Engine:
    """An engine that decodes one token per step with ``runner`` (and its pools), wired by
    hand as the container wires the plain worker."""
    return Engine(
        NonSpeculativeWorker(runner),
        allocator,
        runner.req_to_token_pool,
        vocab_size=runner.vocab_size,
        max_context_len=max_context_len,
        max_running_requests=max_running_requests,
        eos_token_ids=eos_token_ids,
    )
