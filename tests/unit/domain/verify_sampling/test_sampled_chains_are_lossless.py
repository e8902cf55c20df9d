"""Speculative sampling along a chain of sampled drafts is lossless: decoding a Markov target
step after step, each step's drafts drawn from a Markov draft that differs from it, the first
three emitted tokens follow the target's chain (chi-square); the rule equals a request-by-request
walk of the textbook algorithm on random inputs; greedy rows keep the greedy chain's rule; the
Triton chain walk equals the reference."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from eagletree.domain.chain_sampling import verify_chain_drawn, verify_chain_sampled
from eagletree.domain.verify import VerifyResult
from tests.chi_square import markov_p_value
from tests.conftest import requires_triton
from tests.unit.domain.strategies import DEVICES
from tests.unit.domain.verify_sampling.draws import dyadic_probs, edgy_coins

VOCAB = 5
NUM_DRAWS = 40_000
EMITTED = 3  # tokens per sequence compared with the target's chain


@dataclass(frozen=True)
class MarkovCase:
    num_steps: int
    draft_spread: float  # how far the draft's logits stray from the target's
    zero_target_tokens: int = 0  # tokens the target never emits after any token (a top-k cut)
    draft_columns: tuple[int, ...] | None = None  # a draft vocabulary: its columns' target ids


CASES = {
    "close draft, S 3": MarkovCase(3, 0.5),
    "poor draft, S 2": MarkovCase(2, 3.0),
    "one draft": MarkovCase(1, 1.0),
    "the target cuts tokens the draft offers": MarkovCase(3, 1.0, zero_target_tokens=2),
    "a draft vocabulary of three tokens": MarkovCase(2, 1.0, draft_columns=(4, 1, 2)),
}


def transitions(case: MarkovCase, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(target P, draft Q) row-stochastic; Q over the draft's columns where it has some."""
    logits = 1.5 * torch.randn((VOCAB, VOCAB), generator=gen)
    target = torch.softmax(logits, dim=1)
    if case.zero_target_tokens:
        target[:, : case.zero_target_tokens] = 0.0
        target /= target.sum(dim=1, keepdim=True)
    draft_logits = logits + case.draft_spread * torch.randn((VOCAB, VOCAB), generator=gen)
    if case.draft_columns is not None:
        draft_logits = draft_logits[:, list(case.draft_columns)]
    return target, torch.softmax(draft_logits, dim=1)


def decode(case: MarkovCase, gen: torch.Generator) -> torch.Tensor:
    """NUM_DRAWS sequences of EMITTED tokens from token 0, by speculative steps → (draws, 3)."""
    target, draft = transitions(case, gen)
    ids = None if case.draft_columns is None else torch.tensor(case.draft_columns)
    out = torch.full((NUM_DRAWS, EMITTED), -1, dtype=torch.int64)
    count = torch.zeros(NUM_DRAWS, dtype=torch.int64)
    last = torch.zeros(NUM_DRAWS, dtype=torch.int64)
    rows = torch.arange(NUM_DRAWS)
    while bool((count < EMITTED).any()):
        tokens, draft_rows, drawn_p = [last], [], []
        for _ in range(case.num_steps):
            row = draft[tokens[-1]]  # (draws, V_draft)
            column = torch.multinomial(row, 1, generator=gen).squeeze(1)
            tokens.append(column if ids is None else ids[column])
            draft_rows.append(row)
            drawn_p.append(row[rows, column])
        candidates = torch.stack(tokens, dim=1)  # (draws, S + 1)
        result = verify_chain_sampled(
            candidates,
            target[candidates],  # (draws, S + 1, V)
            torch.stack(draft_rows, dim=1),
            torch.stack(drawn_p, dim=1),
            torch.rand((NUM_DRAWS, case.num_steps), generator=gen),
            torch.rand((NUM_DRAWS,), generator=gen),
            ids,
        )
        emitted = result.predict.long().view(NUM_DRAWS, case.num_steps + 1)
        for node in range(case.num_steps + 1):
            taken = (node <= result.accept_length.long()) & (count < EMITTED)
            out[rows[taken], count[taken]] = emitted[taken, node]
            count += taken.long()
        last = torch.where(
            count > 0, out.gather(1, (count - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0
        )
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_emitted_tokens_follow_the_target_chain(name: str) -> None:
    case = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    target, _ = transitions(case, torch.Generator().manual_seed(len(name)))
    p_value, impossible = markov_p_value(decode(case, gen), target)
    assert impossible == 0, "a token of probability 0 was emitted"
    assert p_value > 1e-3


def walk(
    candidates: list[int],
    target: list[list[float]],
    draft: list[list[float]],
    drawn: list[float],
    coins: list[float],
    bonus_coin: float,
    ids: list[int],
) -> tuple[int, list[int]]:
    """The textbook rule for one request, in Python: (accepted drafts, emitted tokens)."""
    emitted: list[int] = []
    for depth, token in enumerate(candidates[1:]):
        if coins[depth] * drawn[depth] < target[depth][token]:
            emitted.append(token)
            continue
        q = [0.0] * len(target[depth])
        for column, token_id in enumerate(ids):
            q[token_id] = draft[depth][column]
        residual = [max(0.0, p - d) for p, d in zip(target[depth], q, strict=True)]
        row = residual if sum(residual) > 0 else target[depth]
        return depth, [*emitted, inverse_cdf(row, bonus_coin)]
    return len(emitted), [*emitted, inverse_cdf(target[-1], bonus_coin)]


def inverse_cdf(row: list[float], coin: float) -> int:
    """``sample_from_probs`` for one row (float32 sums, as torch's cumsum)."""
    cdf = torch.cumsum(torch.tensor(row, dtype=torch.float32), dim=0)
    return int(torch.searchsorted(cdf, coin * cdf[-1:], right=True).clamp(max=len(row) - 1))


@pytest.mark.parametrize("seed", range(6))
def test_the_rule_equals_a_walk_of_each_request(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs, depth, vocab, columns = 64, 1 + seed % 4, 7, 5
    ids = torch.randperm(vocab, generator=gen)[:columns]
    target = torch.softmax(2 * torch.randn((bs, depth + 1, vocab), generator=gen), dim=2)
    target[:, :, 0] = 0.0  # a token the target never emits
    target /= target.sum(dim=2, keepdim=True)
    draft = torch.softmax(2 * torch.randn((bs, depth, columns), generator=gen), dim=2)
    picked = torch.multinomial(draft.view(-1, columns), 1, generator=gen).view(bs, depth)
    candidates = torch.cat([torch.randint(0, vocab, (bs, 1), generator=gen), ids[picked]], dim=1)
    drawn = draft.gather(2, picked.unsqueeze(2)).squeeze(2)
    coins, bonus = torch.rand((bs, depth), generator=gen), torch.rand((bs,), generator=gen)
    result = verify_chain_sampled(candidates, target, draft, drawn, coins, bonus, ids)
    predict = result.predict.view(bs, depth + 1).tolist()
    for b in range(bs):
        accepted, emitted = walk(
            candidates[b].tolist(),
            target[b].tolist(),
            draft[b].tolist(),
            drawn[b].tolist(),
            coins[b].tolist(),
            float(bonus[b]),
            ids.tolist(),
        )
        assert int(result.accept_length[b]) == accepted
        assert predict[b] == emitted + [-1] * (depth - accepted)
        nodes = [b * (depth + 1) + i for i in range(accepted + 1)]
        assert result.accept_index[b].tolist() == nodes + [-1] * (depth - accepted)


def test_greedy_rows_accept_the_target_argmax_path_whatever_their_coins() -> None:
    # one-hot rows, as a sampling batch gives its greedy requests: drafts 3, 1, 4 under a
    # target whose argmaxes are 3, 1, 2, 0 (the third draft is wrong)
    vocab = 5
    target = torch.nn.functional.one_hot(torch.tensor([[3, 1, 2, 0]]), vocab).float()
    candidates = torch.tensor([[0, 3, 1, 4]])
    draft = torch.nn.functional.one_hot(torch.tensor([[3, 1, 4]]), vocab).float()
    for coin in (0.0, 0.5, 1.0 - 2.0**-24):
        result: VerifyResult = verify_chain_sampled(
            candidates,
            target,
            draft,
            torch.ones(1, 3),
            torch.full((1, 3), coin),
            torch.tensor([coin]),
        )
        assert result.accept_length.tolist() == [2]
        assert result.predict.tolist() == [3, 1, 2, -1]
        assert result.accept_index.tolist() == [[0, 1, 2, -1]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("num_steps", "columns", "block_v"), [(3, 40, 16), (1, 24, 16),
                                                                (5, 40, 64)])  # fmt: skip
def test_the_triton_chain_walk_equals_the_reference(
    device: str, num_steps: int, columns: int, block_v: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.chain_sampling import (
        verify_chain_drawn as triton_verify,
    )

    gen = torch.Generator().manual_seed(num_steps * columns)
    bs, vocab = 16, 40  # the interpreter: a program per request, per row and block
    ids = None if columns == vocab else torch.randperm(vocab, generator=gen)[:columns]
    # dyadic rows (every partial sum exact: the block sums' order and the scan's agree); the
    # target never emits its first three tokens, and at 16 columns a block whole blocks of the
    # target rows are empty (the block scan steps over them)
    target = dyadic_probs(bs * (num_steps + 1), vocab, gen).view(bs, num_steps + 1, vocab)
    target[:, :, :3] = 0.0
    target[::3, :, 16:32] = 0.0
    target[:, :, 3] += 1.0 - target.sum(dim=2)  # a row of mass one again
    draft = dyadic_probs(bs * num_steps, columns, gen).view(bs, num_steps, columns)
    draft[1] = torch.nn.functional.one_hot(draft[1].argmax(dim=1), columns).float()  # greedy
    picked = torch.multinomial(draft.view(-1, columns), 1, generator=gen).view(bs, num_steps)
    drafts = picked if ids is None else ids[picked]
    candidates = torch.cat([torch.randint(0, vocab, (bs, 1), generator=gen), drafts], dim=1)
    if ids is None:  # p = q / 2 where request 2 stops: no residual, the bonus from the target
        target[2, 0] = draft[2, 0] / 2
    coins, bonus = edgy_coins((bs, num_steps), gen), edgy_coins((bs,), gen)
    coins[2] = 1.0 - 2.0**-24
    # a bonus coin of 1 stands for a threshold that rounding carried to the row's total: the
    # row's last token with mass, as the reference's clamp gives
    bonus[::5] = 1.0
    # requests 4..7: targets sure of each draft, taken whatever the coin: whole chains
    target[4:8, :num_steps] = torch.nn.functional.one_hot(drafts[4:8], vocab).float()
    expected = verify_chain_drawn(candidates, target, draft, coins, bonus, ids)
    lengths = expected.accept_length.tolist()
    assert num_steps in lengths and min(lengths) < num_steps  # whole chains and rejections
    assert ids is not None or lengths[2] == 0

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    # the coins read in place from the step's (bs, coins) block, as a drawn chain's are
    step_coins = on(torch.full((bs, num_steps + 4), float("nan")))
    step_coins[:, 1 : 1 + num_steps] = on(coins)
    step_coins[:, 2 + num_steps] = on(bonus)
    got = triton_verify(
        on(candidates), on(target), on(draft), step_coins[:, 1 : 1 + num_steps],
        step_coins[:, 2 + num_steps], None if ids is None else on(ids), block_v=block_v,
    )  # fmt: skip
    assert torch.equal(got.accept_length.cpu(), expected.accept_length)
    assert torch.equal(got.accept_index.cpu(), expected.accept_index)
    assert torch.equal(got.predict.cpu(), expected.predict)
