"""A draft that proposes from part of the target vocabulary (an EAGLE-3 draft vocabulary, an
EAGLE token map) returns logits over its own columns and names them by ``token_ids``: the
draft phase and the draft extend must then pick exactly the tokens, probabilities and tree
that the same logits scattered over the whole vocabulary (−inf elsewhere) give."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import pytest
import torch

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.models.stack import MHALayout
from eagletree.app.workers.decode_window import DecodeWindow
from eagletree.app.workers.draft_extender import DraftExtender
from eagletree.app.workers.draft_state import DraftInput
from eagletree.app.workers.tree_drafter import TreeDrafter
from eagletree.domain.batch import ForwardBatch
from eagletree.domain.model_output import ModelOutput
from eagletree.domain.sampling import top_k_probs
from eagletree.domain.tree import DraftTree
from eagletree.ports.model import DraftRunner
from tests.conftest import requires_triton
from tests.integration.models.harness import make_backend, make_pool

if TYPE_CHECKING:
    from eagletree.app.workers.step_kernels import TopK

VOCAB = 50
LAYOUT = MHALayout(layer_num=1, kv_heads=1, head_dim=8, v_head_dim=8)


class PartialVocabularyDraft:
    """A DraftRunner double with seeded random logits over ``token_ids`` (shuffled target ids);
    ``scattered`` returns the same logits over the whole vocabulary instead, −inf elsewhere
    (what a partial-vocabulary head returned before it named its columns)."""

    def __init__(self, token_ids: torch.Tensor, scattered: bool, seed: int) -> None:
        self.req_to_token_pool = TensorReqToTokenPool(4, 64, "cpu")
        self.kv_pool = make_pool(LAYOUT, 4 * 64, torch.float32, torch.device("cpu"))
        self.attention_backend = make_backend("torch", self.kv_pool, self.req_to_token_pool)
        self.vocab_size = VOCAB
        self.token_ids = token_ids
        self._scattered = scattered
        self._generator = torch.Generator().manual_seed(seed)

    def forward(
        self, batch: ForwardBatch, hidden_states: torch.Tensor, logits_rows: object = None
    ) -> ModelOutput:
        rows = batch.num_tokens if logits_rows is None else cast(torch.Tensor, logits_rows).numel()
        logits = torch.randn(rows, self.token_ids.numel(), generator=self._generator)
        hidden = hidden_states + 1.0
        if not self._scattered:
            return ModelOutput(logits=logits, hidden_states=hidden, token_ids=self.token_ids)
        full = torch.full((rows, VOCAB), float("-inf"))
        full[:, self.token_ids] = logits
        return ModelOutput(logits=full, hidden_states=hidden)


def shuffled_ids(count: int, seed: int) -> torch.Tensor:
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:count]


def draft_tree(draft: PartialVocabularyDraft, num_steps: int, k: int, seed: int) -> DraftTree:
    """The tree of a draft phase from a random state whose first picks are the draft's too."""
    bs, ids = 3, draft.token_ids
    lens = torch.tensor([5, 0, 11])
    table = draft.req_to_token_pool.req_to_token
    table[:bs] = torch.randperm(bs * 64, dtype=torch.int32).view(bs, 64) + 1
    window = DecodeWindow(torch.arange(bs), lens, lens, int(lens.sum()))
    generator = torch.Generator().manual_seed(seed)
    state = DraftInput(
        bonus_tokens=torch.randint(VOCAB, (bs,), generator=generator),
        topk_p=torch.softmax(torch.randn(bs, k, generator=generator), -1).sort(-1, True).values,
        topk_index=torch.stack(
            [ids[torch.randperm(ids.numel(), generator=generator)[:k]] for _ in range(bs)]
        ),
        hidden_states=torch.zeros(bs, 4),
    )
    n = min(1 + k + (num_steps - 1) * k * k, 2 * k + 2)
    runner = cast(DraftRunner, draft)
    return TreeDrafter(runner, num_steps=num_steps, topk=k, num_draft_tokens=n).draft(window, state)


@pytest.mark.parametrize(("num_steps", "topk", "columns"), [(2, 2, 7), (4, 3, 20), (5, 4, 50)])
def test_the_draft_phase_builds_the_tree_the_scattered_logits_give(
    num_steps: int, topk: int, columns: int
) -> None:
    ids = shuffled_ids(columns, seed=num_steps)
    named = draft_tree(PartialVocabularyDraft(ids, False, seed=7), num_steps, topk, seed=3)
    scattered = draft_tree(PartialVocabularyDraft(ids, True, seed=7), num_steps, topk, seed=3)
    for field in dataclasses.fields(DraftTree):
        a, b = getattr(named, field.name), getattr(scattered, field.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), field.name
    proposed = named.draft_tokens.view(3, -1)[:, 1:]  # every node but the root (the bonus)
    assert torch.isin(proposed, ids).all()


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_the_draft_extend_picks_the_top_k_the_scattered_logits_give(kernel: str) -> None:
    top_k: TopK = top_k_probs
    if kernel == "triton":  # the merge launch maps the columns itself
        requires_triton("cpu")
        from eagletree.adapters.kernels.triton.draft_topk import top_k_probs as triton_top_k

        top_k = triton_top_k
    ids = shuffled_ids(12, seed=1)
    last_rows = torch.tensor([2, 5, 6])
    batch = cast(ForwardBatch, _TokensOnly(torch.arange(7) + 30, num_tokens=7))
    picks = []
    for scattered in (False, True):
        extender = DraftExtender(
            cast(DraftRunner, PartialVocabularyDraft(ids, scattered, seed=4)),
            topk=4,
            use_aux_hidden=False,
            top_k=top_k_probs if scattered else top_k,
        )
        picks.append(extender.extend_ragged(batch, torch.zeros(7, 4), last_rows))
    named, reference = picks
    assert torch.equal(named.topk_index, reference.topk_index)
    # the Triton kernel sums the softmax in another order than torch's: one more rounding
    rtol = 2e-6 if kernel == "triton" else 1e-6
    torch.testing.assert_close(named.topk_p, reference.topk_p, rtol=rtol, atol=0)
    assert torch.isin(named.topk_index, ids).all()
    assert torch.equal(named.bonus_tokens, torch.tensor([32, 35, 36]))


@dataclasses.dataclass
class _TokensOnly:
    """What ``extend_ragged`` reads of a batch besides handing it to the draft."""

    input_ids: torch.Tensor
    num_tokens: int
