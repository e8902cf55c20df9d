"""Recursive rejection sampling over trees of drawn drafts is lossless: decoding a Markov target
step after step, each step's tree drawn from a Markov draft that differs from it and cut to N
nodes by the drafted scores (EAGLE's beam and selection), the first three emitted tokens follow
the target's chain (chi-square); the rule equals a request-by-request walk of the textbook
algorithm on random trees; a tree of width 1 is the chain's rule; greedy rows accept the
target's argmax path; children are drawn without replacement, scored without their tokens."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from eagletree.domain.chain_sampling import verify_chain_sampled
from eagletree.domain.tree_sampling import FIRST_DRAW_SCORE, draw_children
from eagletree.domain.verify import verify_tree_greedy
from tests.chi_square import chi_square_p_value, markov_p_value
from tests.conftest import requires_triton
from tests.unit.domain.strategies import DEVICES
from tests.unit.domain.verify_sampling.drawn_trees import (
    draw_tree,
    emitted_tokens,
    tree_coins,
    verify,
)
from tests.unit.domain.verify_sampling.draws import edgy_coins

VOCAB = 5
NUM_DRAWS = 30_000
EMITTED = 3


@dataclass(frozen=True)
class TreeCase:
    shape: tuple[int, int, int]  # (S, k, N)
    draft_spread: float
    zero_target_tokens: int = 0
    draft_columns: tuple[int, ...] | None = None
    draft_support: int | None = None  # the draft keeps its this many likeliest tokens (top-k)
    picked: bool = False  # the drafts are the draft's top k, not drawn (the target-only rule)


CASES = {
    "k 2, S 2, N 4": TreeCase((2, 2, 4), 1.0),
    "k 3, S 3, N 7": TreeCase((3, 3, 7), 2.0),
    "k 2, S 3, N 7, close draft": TreeCase((3, 2, 7), 0.3),
    "the target cuts tokens the draft offers": TreeCase((2, 3, 6), 1.0, zero_target_tokens=2),
    "a draft vocabulary of three tokens": TreeCase((2, 2, 5), 1.0, draft_columns=(4, 1, 2)),
    "the draft's support is narrower than k": TreeCase((2, 3, 7), 1.0, draft_support=2),
    "picked drafts": TreeCase((2, 3, 6), 1.0, picked=True),
}


def transitions(case: TreeCase, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = 1.5 * torch.randn((VOCAB, VOCAB), generator=gen)
    target = torch.softmax(logits, dim=1)
    if case.zero_target_tokens:
        target[:, : case.zero_target_tokens] = 0.0
        target /= target.sum(dim=1, keepdim=True)
    draft_logits = logits + case.draft_spread * torch.randn((VOCAB, VOCAB), generator=gen)
    if case.draft_columns is not None:
        draft_logits = draft_logits[:, list(case.draft_columns)]
    draft = torch.softmax(draft_logits, dim=1)
    if case.draft_support is not None:
        kept = torch.sort(draft, dim=1, descending=True).values[:, case.draft_support - 1 :]
        draft = torch.where(draft >= kept[:, :1], draft, 0.0)
        draft /= draft.sum(dim=1, keepdim=True)
    return target, draft


def decode(case: TreeCase, gen: torch.Generator) -> torch.Tensor:
    """NUM_DRAWS sequences of EMITTED tokens from token 0, by drawn-tree steps → (draws, 3)."""
    target, draft = transitions(case, gen)
    ids = None if case.draft_columns is None else torch.tensor(case.draft_columns)
    num_steps, k, n = case.shape
    out = torch.full((NUM_DRAWS, EMITTED), -1, dtype=torch.int64)
    count = torch.zeros(NUM_DRAWS, dtype=torch.int64)
    last = torch.zeros(NUM_DRAWS, dtype=torch.int64)
    drawn = torch.full((NUM_DRAWS,), not case.picked)
    while bool((count < EMITTED).any()):
        coins = torch.rand((NUM_DRAWS, tree_coins(num_steps, k)), generator=gen)
        picked = None if not case.picked else ~drawn
        tree = draw_tree(last, draft, case.shape, coins, ids, picked)
        accept_coins = torch.rand((NUM_DRAWS, n - 1), generator=gen)
        bonus = torch.rand((NUM_DRAWS,), generator=gen)
        result = verify(tree, target, drawn, accept_coins, bonus, case.shape, ids)
        for b, tokens in enumerate(emitted_tokens(result)):
            for token in tokens[: EMITTED - int(count[b])]:
                out[b, count[b]] = token
                count[b] += 1
        last = out.gather(1, (count - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
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
    tokens: list[int],
    parents: list[int],
    ranks: list[int],
    rows: list[torch.Tensor],
    target: torch.Tensor,
    drawn: bool,
    coins: list[float],
    bonus_coin: float,
) -> list[int]:
    """The textbook rule for one request: children in draw order, each tested against the
    residual the earlier rejections left; the emitted tokens."""
    last, emitted = 0, list[int]()
    while True:
        p = target[tokens[last]].clone()
        kids = sorted((ranks[i], i) for i in range(len(tokens)) if parents[i] == last)
        remaining = rows[kids[0][1]].clone() if kids else None
        accepted = None
        for _, child in kids:
            x = tokens[child]
            if drawn:
                assert remaining is not None
                if float(remaining.sum()) <= 0:
                    break
                q = remaining / remaining.sum()
            else:
                q = torch.nn.functional.one_hot(torch.tensor(x), len(p)).float()
            if coins[child - 1] * float(q[x]) < float(p[x]):
                accepted = child
                break
            left = (p - q).clamp(min=0.0)
            if float(left.sum()) > 0:
                p = left / left.sum()
            if remaining is not None:
                remaining[x] = 0.0
        if accepted is None:
            row = p if float(p.sum()) > 0 else target[tokens[last]]
            return [*emitted, inverse_cdf(row, bonus_coin)]
        emitted.append(tokens[accepted])
        last = accepted


def inverse_cdf(row: torch.Tensor, coin: float) -> int:
    cdf = torch.cumsum(row.float(), dim=0)
    index = int(torch.searchsorted(cdf, coin * cdf[-1:], right=True))
    return min(index, int(torch.nonzero(row > 0).max()))


@pytest.mark.parametrize("seed", range(6))
def test_the_rule_equals_a_walk_of_each_request(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = ((2, 2, 4), (3, 3, 8), (3, 2, 6), (4, 3, 11), (2, 4, 9), (3, 2, 7))[seed]
    num_steps, k, n = shape
    batch, vocab = 96, 7
    target = torch.softmax(2 * torch.randn((vocab, vocab), generator=gen), dim=1)
    target[:, 0] = 0.0
    target /= target.sum(dim=1, keepdim=True)
    draft = torch.softmax(2 * torch.randn((vocab, vocab), generator=gen), dim=1)
    draft[:, 1:3] *= seed % 2  # odd seeds: a draft whose support can run out
    draft /= draft.sum(dim=1, keepdim=True)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    drawn = torch.rand((batch,), generator=gen) < 0.8
    tree = draw_tree(
        roots,
        draft,
        shape,
        torch.rand((batch, tree_coins(num_steps, k)), generator=gen),
        None,
        ~drawn,
    )
    coins, bonus = torch.rand((batch, n - 1), generator=gen), torch.rand((batch,), generator=gen)
    result = verify(tree, target, drawn, coins, bonus, shape, None)
    for b, emitted in enumerate(emitted_tokens(result)):
        rows = [tree.draft_probs[b, max(int(s), 0)] for s in tree.sources[b]]
        expected = walk(
            tree.candidates[b].tolist(),
            tree.parents[b].tolist(),
            tree.ranks[b].tolist(),
            rows,
            target,
            bool(drawn[b]),
            coins[b].tolist(),
            float(bonus[b]),
        )
        assert emitted == expected, b


def test_a_tree_of_width_one_is_the_chains_rule() -> None:
    gen = torch.Generator().manual_seed(3)
    batch, vocab, columns, shape = 128, 8, 6, (4, 1, 5)
    ids = torch.randperm(vocab, generator=gen)[:columns]
    target = torch.softmax(2 * torch.randn((vocab, vocab), generator=gen), dim=1)
    draft = torch.softmax(2 * torch.randn((vocab, columns), generator=gen), dim=1)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    tree = draw_tree(roots, draft, shape, torch.rand((batch, 4), generator=gen), ids)
    coins, bonus = torch.rand((batch, 4), generator=gen), torch.rand((batch,), generator=gen)
    drawn = torch.ones(batch, dtype=torch.bool)
    tree_result = verify(tree, target, drawn, coins, bonus, shape, ids)
    column_of_token = torch.full((vocab,), -1, dtype=torch.int64)
    column_of_token[ids] = torch.arange(columns)
    column_of = column_of_token[tree.candidates[:, 1:]]  # each draft's column
    chain = verify_chain_sampled(
        tree.candidates,
        target[tree.candidates],
        tree.draft_probs,
        tree.draft_probs.gather(2, column_of.unsqueeze(2)).squeeze(2),
        coins,
        bonus,
        ids,
    )
    assert torch.equal(tree_result.accept_length, chain.accept_length)
    assert torch.equal(tree_result.accept_index, chain.accept_index)
    assert torch.equal(tree_result.predict, chain.predict)


def test_greedy_rows_accept_the_target_argmax_path_whatever_their_coins() -> None:
    gen = torch.Generator().manual_seed(5)
    batch, vocab, shape = 64, 6, (3, 3, 9)
    target = torch.nn.functional.one_hot(torch.randint(0, vocab, (vocab,), generator=gen), vocab)
    draft = torch.softmax(2 * torch.randn((vocab, vocab), generator=gen), dim=1)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    picked = torch.ones(batch, dtype=torch.bool)
    tree = draw_tree(roots, draft, shape, torch.rand((batch, 3 + 2 * 9)), None, picked)
    links = tree_links(tree.parents)
    greedy = verify_tree_greedy(
        tree.candidates, *links, target.argmax(dim=1)[tree.candidates], shape[0]
    )
    for coin in (0.0, 0.5, 1.0 - 2.0**-24):
        result = verify(
            tree,
            target.float(),
            ~picked,
            torch.full((batch, 8), coin),
            torch.full((batch,), coin),
            shape,
            None,
        )
        assert torch.equal(result.accept_length, greedy.accept_length)
        assert torch.equal(result.accept_index, greedy.accept_index)
        assert torch.equal(result.predict, greedy.predict)


def tree_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from eagletree.domain.tree import child_links

    batch, n = parents.shape
    retrieve_index = torch.arange(n).unsqueeze(0) + n * torch.arange(batch).unsqueeze(1)
    return (retrieve_index, *child_links(parents))


def test_children_are_drawn_without_replacement_and_scored_before_they_are_drawn() -> None:
    gen = torch.Generator().manual_seed(11)
    q = torch.tensor([0.5, 0.25, 0.15, 0.1])
    draws = 40_000
    coins = torch.rand((draws, 3), generator=gen)
    columns, scores = draw_children(q.expand(draws, 4), coins)
    # ordered pairs follow q(a)·q(b) / (1 − q(a))
    pairs = torch.bincount(columns[:, 0] * 4 + columns[:, 1], minlength=16).double()
    expected = (q[:, None] * q[None, :] / (1 - q[:, None])).fill_diagonal_(0).flatten()
    assert pairs.view(4, 4).diagonal().sum() == 0
    assert chi_square_p_value(pairs, draws * expected.double()) > 1e-3
    # scores: a constant for the first draw, then the collision probability of what is left,
    # never rising along the draw order
    assert bool((scores[:, 0] == FIRST_DRAW_SCORE).all())
    collision = float((q * q).sum())
    left = (collision - q[columns[:, 0]] ** 2) / (1 - q[columns[:, 0]])
    assert torch.allclose(scores[:, 1], left.clamp(max=FIRST_DRAW_SCORE))
    assert bool((scores[:, 1:] <= scores[:, :-1]).all())
    # a support of two: the third draw is a placeholder scored 0
    narrow = torch.tensor([[0.0, 0.7, 0.0, 0.3]])
    columns, scores = draw_children(narrow, torch.tensor([[0.9, 0.9, 0.9]]))
    assert columns[0, :2].tolist() == [3, 1] and float(scores[0, 2]) == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_the_triton_walk_equals_the_reference(device: str, seed: int) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.tree_sampling import (
        verify_tree_drawn as triton_verify,
    )

    gen = torch.Generator().manual_seed(100 + seed)
    shape = ((3, 3, 8), (4, 2, 9), (2, 4, 9), (3, 1, 4))[seed]
    num_steps, k, n = shape
    batch, vocab, columns = 16, 40, (40, 40, 24, 40)[seed]  # the interpreter: a program each
    ids = None if columns == vocab else torch.randperm(vocab, generator=gen)[:columns]
    target = torch.softmax(2 * torch.randn((vocab, vocab), generator=gen), dim=1)
    target[:, :3] = 0.0  # tokens the target never emits
    target /= target.sum(dim=1, keepdim=True)
    draft = torch.softmax(2 * torch.randn((vocab, columns), generator=gen), dim=1)
    if seed == 1:  # a draft whose support can run out
        draft = torch.where(draft >= draft.topk(2, dim=1).values[:, 1:], draft, 0.0)
        draft /= draft.sum(dim=1, keepdim=True)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    drawn = torch.rand((batch,), generator=gen) < 0.75
    tree = draw_tree(
        roots, draft, shape, torch.rand((batch, tree_coins(num_steps, k)), generator=gen), ids,
        ~drawn,
    )  # fmt: skip
    coins, bonus = torch.rand((batch, n - 1), generator=gen), torch.rand((batch,), generator=gen)
    expected = verify(tree, target, drawn, coins, bonus, shape, ids)

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    # 16 columns a pass: the vocabulary's 40 cross three blocks (the carries between them)
    got = triton_verify(
        on(tree.candidates), on(tree.parents), on(tree.ranks), on(tree.sources),
        on(target[tree.candidates]), on(tree.draft_probs), on(drawn), on(coins), on(bonus),
        num_steps, k, None if ids is None else on(ids), block_v=16 if seed % 2 else 64,
    )  # fmt: skip
    assert torch.equal(got.accept_length.cpu(), expected.accept_length)
    assert torch.equal(got.accept_index.cpu(), expected.accept_index)
    assert torch.equal(got.predict.cpu(), expected.predict)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("k", "vocab", "block_v"), [(4, 40, 16), (8, 37, 64), (1, 50, 16)])
def test_the_triton_draws_equal_the_reference(
    device: str, k: int, vocab: int, block_v: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draw_children import draw_children as triton_draw

    gen = torch.Generator().manual_seed(k * vocab)
    rows = 24  # the interpreter runs a program per row
    probs = torch.softmax(2 * torch.randn((rows, vocab), generator=gen), dim=1)
    # a quarter of the rows keep 3 tokens (a top-k request): draws run past their support
    narrow = torch.where(probs >= probs.topk(3, dim=1).values[:, 2:], probs, 0.0)
    probs[: rows // 4] = (narrow / narrow.sum(dim=1, keepdim=True))[: rows // 4]
    # another quarter with a block of zeros between their tokens: the block sums' scan must
    # step over an empty block, and the coins at 0 and just below 1 pick the row's edges
    hole = probs[rows // 4 : rows // 2]
    hole[:, block_v : 2 * block_v] = 0.0
    probs[rows // 4 : rows // 2] = hole / hole.sum(dim=1, keepdim=True)
    coins = edgy_coins((rows, k), gen)
    columns, scores = draw_children(probs, coins)
    # read in place from larger blocks, as a drawn chain's depth and the step's coins are
    depths = torch.full((rows, 3, vocab), float("nan"), device=device)
    depths[:, 1] = probs.to(device)
    step_coins = torch.full((rows, k + 5), float("nan"), device=device)
    step_coins[:, 2 : 2 + k] = coins.to(device)
    got = triton_draw(depths[:, 1], step_coins[:, 2 : 2 + k], block_v=block_v)
    assert torch.equal(got[0].cpu(), columns)
    assert torch.allclose(got[1].cpu(), scores, rtol=1e-5, atol=1e-7)
