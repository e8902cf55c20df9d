"""The draft phase of EagleWorkerV2: each branch of the beam attends to its true
ancestors and writes its window slot, however the beam re-ranks."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.models.stack import MHALayout
from eagletree.domain.batch import DraftDecodeSpec, ForwardBatch, ForwardMode
from eagletree.domain.model_output import ModelOutput
from eagletree.ports.memory import KVPool
from tests.integration.models.harness import make_backend, make_pool

SIZES_LAYOUT = MHALayout(layer_num=1, kv_heads=1, head_dim=8, v_head_dim=8)


class PathTracingDraft:
    """A DraftRunner double whose hidden state is the list of draft slots along its path.

    Output hidden row r = input hidden row r with the row's own slot appended at column
    ``depth``; the beam hands each survivor its parent's hidden state, so a branch's hidden
    state lists its true ancestors' slots independently of the drafter's bookkeeping. Logits
    are random (seeded), so the beam re-ranks.
    """

    def __init__(self, table: TensorReqToTokenPool, pool: KVPool, vocab: int, seed: int) -> None:
        self.req_to_token_pool = table
        self.kv_pool = pool
        self.attention_backend = make_backend("torch", pool, table)
        self.vocab_size = vocab
        self.token_ids = None  # its logits are over the whole vocabulary
        self._generator = torch.Generator().manual_seed(seed)
        self.batches: list[ForwardBatch] = []
        self.num_reranked = 0

    def forward(
        self, batch: ForwardBatch, hidden_states: torch.Tensor, logits_rows: object = None
    ) -> ModelOutput:
        assert isinstance(batch.spec, DraftDecodeSpec) and batch.mode is ForwardMode.DRAFT_DECODE
        ancestors = batch.spec.ancestor_slots
        depth = ancestors.shape[1]
        assert torch.equal(ancestors, hidden_states[:, :depth].long())
        if depth:  # the parent's own slot is the last one; another branch's means a re-rank
            previous = self.batches[-1].out_cache_loc
            self.num_reranked += int((ancestors[:, -1] != previous).sum())
        self.batches.append(batch)
        hidden = hidden_states.clone()
        hidden[:, depth] = batch.out_cache_loc.to(hidden.dtype)
        logits = torch.randn(batch.num_tokens, self.vocab_size, generator=self._generator)
        return ModelOutput(logits=logits, hidden_states=hidden)


@pytest.mark.parametrize(("num_steps", "topk"), [(2, 2), (4, 3), (5, 4)])
def test_each_draft_branch_attends_to_its_true_ancestors_at_its_window_slots(
    num_steps: int, topk: int
) -> None:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.app.workers.tree_drafter import TreeDrafter

    bs, vocab, k = 3, 40, topk
    lens = torch.tensor([5, 0, 11])
    table = TensorReqToTokenPool(4, 64, "cpu")
    table.req_to_token[:bs] = torch.randperm(bs * 64, dtype=torch.int32).view(bs, 64) + 1
    pool = make_pool(SIZES_LAYOUT, 4 * 64, torch.float32, torch.device("cpu"))
    draft = PathTracingDraft(table, pool, vocab, seed=num_steps)
    window = DecodeWindow(torch.arange(bs), lens, lens, int(lens.sum()))
    generator = torch.Generator().manual_seed(1)
    state = DraftInput(
        bonus_tokens=torch.randint(vocab, (bs,), generator=generator),
        topk_p=torch.softmax(torch.randn(bs, k, generator=generator), -1).sort(-1, True).values,
        topk_index=torch.stack([torch.randperm(vocab, generator=generator)[:k] for _ in range(bs)]),
        hidden_states=torch.zeros(bs, num_steps),
    )
    n = min(1 + k + (num_steps - 1) * k * k, 2 * k + 2)
    drafter = TreeDrafter(draft, num_steps=num_steps, topk=k, num_draft_tokens=n)
    tree = drafter.draft(window, state)
    assert len(draft.batches) == num_steps - 1
    for i, batch in enumerate(draft.batches):
        assert torch.equal(batch.positions, (lens + i).repeat_interleave(k))
        # branch j of forward i writes window position j·S + i
        columns = lens.view(bs, 1) + torch.arange(k).view(1, k) * num_steps + i
        expected = table.req_to_token[torch.arange(bs).view(bs, 1), columns].long().flatten()
        assert torch.equal(batch.out_cache_loc, expected)
    if num_steps > 2:
        assert draft.num_reranked > 0  # the test saw beams whose branches changed places
    assert tree.draft_tokens.shape == (bs * n,)
    assert torch.equal(tree.draft_tokens.view(bs, n)[:, 0], state.bonus_tokens)
