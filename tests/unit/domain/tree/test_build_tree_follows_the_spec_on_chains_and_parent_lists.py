"""``build_tree`` on fixed inputs: top-k 1 gives the chain whatever parent_list holds,
and a tree follows parent_list by the spec's rule."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.tree import TreeMaskMode, build_tree

from ..brute_force.tree import node_parents_from_parent_list, tree_reference
from ..strategies import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_steps", [1, 2, 5])
@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_topk_one_gives_the_chain_whatever_parent_list_holds(
    device: str, num_steps: int, mode: TreeMaskMode
) -> None:
    gen = torch.Generator().manual_seed(num_steps)
    bs, n = 3, num_steps + 1
    seq_lens = torch.tensor([0, 4, 9])
    garbage_parent_list = torch.randint(-1, 50, (bs, num_steps), generator=gen)
    top_scores_index = torch.arange(n - 1).expand(bs, n - 1)
    draft_tokens = torch.randint(100, (bs, n - 1), generator=gen)
    verified = torch.randint(100, (bs,), generator=gen)
    tree = build_tree(
        verified.to(device),
        garbage_parent_list.to(device),
        top_scores_index.to(device),
        draft_tokens.to(device),
        seq_lens.to(device),
        1,
        num_steps,
        n,
        mode,
        seq_lens_sum=int(seq_lens.sum()),
    )
    chain = [-1, *range(n - 1)]
    tokens = [
        [root, *row] for root, row in zip(verified.tolist(), draft_tokens.tolist(), strict=True)
    ]
    ref = tree_reference([chain] * bs, tokens, seq_lens.tolist())
    assert node_parents_from_parent_list(list(range(n - 1)), [], 1) == chain
    assert tree.parents.tolist() == [chain] * bs
    assert tree.positions.tolist() == ref.positions
    assert tree.retrieve_next_token.tolist() == [[*range(1, n), -1]] * bs
    assert tree.retrieve_next_sibling.tolist() == [[-1] * n] * bs
    expected_mask = ref.full_mask if mode is TreeMaskMode.FULL_MASK else ref.qlen_mask
    assert tree.tree_mask.tolist() == expected_mask


@pytest.mark.parametrize("device", DEVICES)
def test_build_tree_follows_parent_list_by_the_spec_rule(device: str) -> None:
    # k = 2, S = 3: candidates 0..1 (depth 1), 2..5 (step 1), 6..9 (step 2);
    # parent_list = [-1, 0, 1, survivors of step 1]; survivors 5 (branch 1, child 1) and 2
    k, steps, n = 2, 3, 7
    parent_list = torch.tensor([[-1, 0, 1, 5, 2]])
    # 2 → parent_list[1] = 0; 5 → parent_list[2] = 1; 6 → parent_list[3] = 5; 9 → 2
    top_scores_index = torch.tensor([[0, 1, 2, 5, 6, 9]])
    expected = node_parents_from_parent_list([0, 1, 2, 5, 6, 9], [-1, 0, 1, 5, 2], k)
    assert expected == [-1, 0, 0, 1, 2, 4, 3]
    tree = build_tree(
        torch.tensor([7], device=device),
        parent_list.to(device),
        top_scores_index.to(device),
        torch.tensor([[10, 11, 12, 15, 16, 19]], device=device),
        torch.tensor([3], device=device),
        k,
        steps,
        n,
        TreeMaskMode.QLEN_ONLY,
    )
    ref = tree_reference([expected], [[7, 10, 11, 12, 15, 16, 19]], [3])
    assert tree.parents.tolist() == ref.parents
    assert tree.positions.tolist() == ref.positions == [3, 4, 4, 5, 5, 6, 6]
    assert tree.retrieve_next_token.tolist() == ref.next_token
    assert tree.retrieve_next_sibling.tolist() == ref.next_sibling
    assert tree.tree_mask.tolist() == ref.qlen_mask
