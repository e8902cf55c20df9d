"""Target-only tree sampling is lossless in distribution: over fixed trees and
targets, the first two emitted tokens follow the target's distribution
(chi-square)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from eagletree.domain.sampling import probs_from_logits
from eagletree.domain.verify import verify_tree_sampling
from tests.chi_square import chi_square_p_value

from ..brute_force.tree import child_lists, links_from_child_lists
from ..strategies import DEVICES


@dataclass(frozen=True)
class LosslessCase:
    """A fixed tree and a target whose distribution depends only on the path's tokens."""

    parents: list[int]
    tokens: list[int]  # node tokens, root first, distinct among siblings
    num_steps: int
    vocab: int
    boost: float  # added to the target logits of a node's drafted children: a good draft
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    sibling_order: str = "increasing"


DEEP_AND_WIDE = [-1, 0, 0, 0, 1, 1, 3, 4, 2, 8]
DEEP_AND_WIDE_TOKENS = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]
LOSSLESS_CASES = {
    "chain, full acceptance likely": LosslessCase([-1, 0, 1, 2], [0, 1, 2, 3], 3, 6, 4.0),
    "one-draft chain, bonus after full acceptance": LosslessCase([-1, 0], [0, 3], 1, 6, 3.0),
    # deeper than S: the bonus after S accepted drafts may be the drafted child's token
    "chain deeper than S, bonus from the full row": LosslessCase([-1, 0, 1], [0, 3, 4], 1, 6, 3.0),
    "wide root": LosslessCase([-1, 0, 0, 0, 0, 0], [5, 0, 1, 2, 3, 4], 1, 7, 0.5),
    "wide root, reversed sibling links": LosslessCase(
        [-1, 0, 0, 0, 0, 0], [5, 0, 1, 2, 3, 4], 2, 7, 1.0, sibling_order="reversed"
    ),
    "deep and wide": LosslessCase(DEEP_AND_WIDE, DEEP_AND_WIDE_TOKENS, 3, 8, 1.0),
    "deep and wide, temperature, top-k, top-p": LosslessCase(
        DEEP_AND_WIDE, DEEP_AND_WIDE_TOKENS, 3, 8, 1.0, temperature=0.7, top_k=5, top_p=0.9
    ),
}
NUM_DRAWS = 20_000


def paths_of(case: LosslessCase) -> list[tuple[int, ...]]:
    """The token path (root first) that ends at every node."""
    paths: list[tuple[int, ...]] = []
    for i, parent in enumerate(case.parents):
        paths.append((case.tokens[i],) if parent < 0 else (*paths[parent], case.tokens[i]))
    return paths


def target_probs(case: LosslessCase, paths: list[tuple[int, ...]]) -> torch.Tensor:
    """The target's next-token distribution after each token path → (len(paths), V)."""
    node_of_path = {p: i for i, p in enumerate(paths_of(case))}
    children = child_lists(case.parents)
    rows = []
    for path in paths:
        rng = random.Random(repr(path))  # the same path always gets the same logits
        logits = [rng.gauss(0.0, 1.0) for _ in range(case.vocab)]
        for kid in children[node_of_path[path]] if path in node_of_path else []:
            logits[case.tokens[kid]] += case.boost
        rows.append(logits)
    count = len(paths)
    return probs_from_logits(
        torch.tensor(rows),
        torch.full((count,), case.temperature),
        torch.full((count,), case.top_k),
        torch.full((count,), case.top_p),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(LOSSLESS_CASES))
def test_the_first_two_emitted_tokens_follow_the_target_distribution(
    device: str, name: str
) -> None:
    case = LOSSLESS_CASES[name]
    n, vocab, bs = len(case.parents), case.vocab, NUM_DRAWS
    gen = torch.Generator().manual_seed(len(name))
    node_probs = target_probs(case, paths_of(case))  # (N, V)
    root = case.tokens[0]
    second_probs = target_probs(case, [(root, t) for t in range(vocab)])  # (V, V) row = t1
    children = child_lists(case.parents)
    if case.sibling_order == "reversed":
        children = [kids[::-1] for kids in children]
    next_token, next_sibling = links_from_child_lists(children)

    def repeated(row: list[int]) -> torch.Tensor:
        return torch.tensor(row, device=device).expand(bs, n).contiguous()

    result = verify_tree_sampling(
        repeated(case.tokens),
        torch.arange(bs * n, device=device).view(bs, n),
        repeated(next_token),
        repeated(next_sibling),
        node_probs.to(device).expand(bs, n, vocab),
        torch.rand((bs, n), generator=gen).to(device),
        torch.rand((bs,), generator=gen).to(device),
        case.num_steps,
    )
    predict = result.predict.long().cpu()
    accept_index = result.accept_index.long().cpu()
    accepted_drafts = result.accept_length.cpu()
    first = predict[accept_index[:, 0]]
    second_in_step = predict[accept_index[:, 1].clamp(min=0)]
    # a step that emitted one token: its successor comes from the target itself (next step)
    second_next_step = torch.multinomial(second_probs[first], 1, generator=gen).squeeze(1)
    second = torch.where(accepted_drafts >= 1, second_in_step, second_next_step)

    observed = torch.bincount(first * vocab + second, minlength=vocab * vocab).double()
    expected = bs * (node_probs[0].unsqueeze(1) * second_probs).flatten().double()
    assert observed[expected == 0].sum() == 0, "a token of probability 0 was emitted"
    assert chi_square_p_value(observed, expected) > 1e-3
    if "chain" in name:  # the case is meant to exercise full acceptance
        assert (accepted_drafts == case.num_steps).float().mean() > 0.3
