"""The one-launch Triton tree builder against ``domain.tree.build_tree`` (QLEN_ONLY), field by
field and bit for bit, on hypothesis' draft beams (exact ties included), chains and edge cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from eagletree.domain.tree import DraftTree, TreeMaskMode, build_tree
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .strategies import DEVICES, DraftCase, draft_cases
from .tree.beam_runs import organize, run_beam

FIELDS = (
    "tree_mask",
    "positions",
    "retrieve_index",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "draft_tokens",
    "parents",
)


def triton_build_tree(device: str):  # type: ignore[no-untyped-def]
    requires_triton(device)
    from eagletree.adapters.kernels.triton.tree_build import build_tree as triton_build

    return triton_build


def assert_same_tree(got: DraftTree, expected: DraftTree) -> None:
    assert got.mask_mode is expected.mask_mode
    for field in FIELDS:
        a, b = getattr(got, field), getattr(expected, field)
        assert a.dtype == b.dtype and a.shape == b.shape, field
        assert torch.equal(a.cpu(), b.cpu()), field


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(60), deadline=None)
@given(case=draft_cases())
def test_the_triton_tree_equals_the_reference_tree(device: str, case: DraftCase) -> None:
    build = triton_build_tree(device)
    parent_list, top_scores_index, draft_tokens = organize(case, run_beam(case, device))
    args = (
        case.verified_id.to(device),
        parent_list,
        top_scores_index,
        draft_tokens,
        case.seq_lens.to(device),
        case.topk,
        case.num_steps,
        case.num_draft_tokens,
        TreeMaskMode.QLEN_ONLY,
    )
    assert_same_tree(build(*args), build_tree(*args))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_steps", [1, 3])
def test_a_chain_ignores_whatever_parent_list_holds(device: str, num_steps: int) -> None:
    build = triton_build_tree(device)
    generator = torch.Generator().manual_seed(num_steps)
    bs, n = 3, num_steps + 1
    args = (
        torch.randint(100, (bs,), generator=generator).to(device),
        torch.randint(-1, 50, (bs, num_steps), generator=generator).to(device),
        torch.arange(n - 1).expand(bs, n - 1).contiguous().to(device),
        torch.randint(100, (bs, n - 1), generator=generator).to(device),
        torch.tensor([0, 4, 9], device=device),
        1,
        num_steps,
        n,
        TreeMaskMode.QLEN_ONLY,
    )
    assert_same_tree(build(*args), build_tree(*args))


@pytest.mark.parametrize("device", DEVICES)
def test_a_full_mask_and_an_empty_batch_follow_the_reference(device: str) -> None:
    build = triton_build_tree(device)
    k, steps, n = 2, 3, 7
    args = (
        torch.tensor([7], device=device),
        torch.tensor([[-1, 0, 1, 5, 2]], device=device),
        torch.tensor([[0, 1, 2, 5, 6, 9]], device=device),
        torch.tensor([[10, 11, 12, 15, 16, 19]], device=device),
        torch.tensor([3], device=device),
        k,
        steps,
        n,
    )
    for mode in TreeMaskMode:
        assert_same_tree(build(*args, mode), build_tree(*args, mode))
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    none = torch.zeros((0, 6), dtype=torch.int64, device=device)
    empty_args = (empty, none[:, :5], none, none, empty, k, steps, n, TreeMaskMode.QLEN_ONLY)
    assert_same_tree(build(*empty_args), build_tree(*empty_args))
