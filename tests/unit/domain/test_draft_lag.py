"""A plain step's per-row writes (``domain.draft_lag``): the torch reference against a request
by request loop, and the Triton kernel against the reference, on random states."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.domain.draft_lag import plain_step_writes
from tests.conftest import requires_triton
from tests.hypothesis_profiles import examples

from .strategies import DEVICES

Writes = Callable[..., None]


def implementation(impl: str, device: str) -> Writes:
    if impl == "torch":
        return plain_step_writes
    requires_triton(device)
    from eagletree.adapters.kernels.triton.plain_step_writes import plain_step_writes as kernel

    return kernel


@dataclass
class Case:
    """A step's inputs over ``bs`` distinct rows of ``num_rows``, and the state it writes."""

    rows: torch.Tensor
    tokens: torch.Tensor
    features: torch.Tensor
    seq_lens: torch.Tensor
    lag_tokens: torch.Tensor
    lag_features: torch.Tensor
    lag_count: torch.Tensor
    committed: torch.Tensor
    pending: torch.Tensor

    def state(self) -> list[torch.Tensor]:
        return [self.lag_tokens, self.lag_features, self.lag_count, self.committed, self.pending]

    def to(self, device: str) -> Case:
        return Case(*(t.to(device) for t in vars(self).values()))

    def clone(self) -> Case:
        return Case(*(t.clone() for t in vars(self).values()))

    def write(self, writes: Writes, with_pending: bool) -> None:
        writes(
            self.rows,
            self.tokens,
            self.features,
            self.seq_lens,
            self.lag_tokens,
            self.lag_features,
            self.lag_count,
            self.committed,
            self.pending if with_pending else None,
        )


def random_case(
    seed: int, bs: int, num_rows: int, width: int, num_features: int, feature_dtype: torch.dtype
) -> Case:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(num_rows, generator=g)[:bs]
    wide = torch.randn(bs, num_features + 3, generator=g).to(feature_dtype)
    return Case(
        rows=rows,
        tokens=torch.randint(0, 1000, (bs,), generator=g),
        features=wide[:, 1 : num_features + 1],  # rows apart by more than their width
        seq_lens=torch.randint(0, 500, (bs,), generator=g),
        lag_tokens=torch.randint(0, 1000, (num_rows, width), generator=g),
        lag_features=torch.randn(num_rows, width, num_features, generator=g),
        # full rows too (count == width: the last pair is overwritten)
        lag_count=torch.randint(0, width + 1, (num_rows,), generator=g),
        committed=torch.randint(0, 500, (num_rows,), generator=g),
        pending=torch.randint(0, 1000, (num_rows,), generator=g),
    )


def loop_writes(case: Case, with_pending: bool) -> None:
    """What the step writes, one request at a time."""
    width = case.lag_tokens.shape[1]
    for i, row in enumerate(case.rows.tolist()):
        column = min(int(case.lag_count[row]), width - 1)
        case.lag_tokens[row, column] = case.tokens[i]
        case.lag_features[row, column] = case.features[i].float()
        case.lag_count[row] = column + 1
        case.committed[row] = case.seq_lens[i] + 1
        if with_pending:
            case.pending[row] = case.tokens[i]


cases = st.tuples(
    st.integers(0, 2**31 - 1),  # seed
    st.integers(1, 6),  # bs
    st.integers(0, 4),  # rows no request owns
    st.integers(1, 5),  # width
    st.integers(1, 40),  # features
    st.booleans(),  # pending written
    st.sampled_from([torch.float32, torch.bfloat16]),
)


@settings(max_examples=examples(100), deadline=None)
@given(drawn=cases)
def test_the_reference_writes_what_a_request_by_request_loop_writes(
    drawn: tuple[int, int, int, int, int, bool, torch.dtype],
) -> None:
    seed, bs, spare, width, num_features, with_pending, dtype = drawn
    case = random_case(seed, bs, bs + spare, width, num_features, dtype)
    expected = case.clone()
    loop_writes(expected, with_pending)
    before = case.clone()
    case.write(plain_step_writes, with_pending)
    for got, want in zip(case.state(), expected.state(), strict=True):
        assert torch.equal(got, want)
    untouched = torch.ones(case.committed.shape[0], dtype=torch.bool)
    untouched[case.rows] = False
    for got, old in zip(case.state(), before.state(), strict=True):
        assert torch.equal(got[untouched], old[untouched])  # rows outside the step keep theirs


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(50), deadline=None)
@given(drawn=cases)
def test_the_kernel_writes_what_the_reference_writes(
    device: str, drawn: tuple[int, int, int, int, int, bool, torch.dtype]
) -> None:
    seed, bs, spare, width, num_features, with_pending, dtype = drawn
    case = random_case(seed, bs, bs + spare, width, num_features, dtype).to(device)
    expected = case.clone()
    expected.write(plain_step_writes, with_pending)
    case.write(implementation("triton", device), with_pending)
    for got, want in zip(case.state(), expected.state(), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_the_kernel_moves_features_wider_than_one_block_and_padding_rows_stay_in_bounds(
    device: str,
) -> None:
    # 2,500 features: three of the kernel's blocks; rows 5 and 6 repeat padding row 7, full
    case = random_case(3, 7, 8, 4, 2500, torch.bfloat16)
    case.rows = torch.tensor([0, 2, 4, 1, 3, 7, 7])
    case.lag_count[7] = 4
    case = case.to(device)
    expected = case.clone()
    expected.write(plain_step_writes, True)
    case.write(implementation("triton", device), True)
    real = case.rows[:5]
    for got, want in zip(case.state(), expected.state(), strict=True):
        assert torch.equal(got[real], want[real])
    assert int(case.lag_count[7]) == 4  # the padding row's writes stayed inside its lag
