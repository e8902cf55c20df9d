"""Tests of the per-forward value objects: forward modes and ForwardBatch (and the tests' rule
for a fixed-width batch's tokens per request, ``tests/batch_widths.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagletree.domain.batch import (
    DraftDecodeSpec,
    DraftExtendSpec,
    ForwardBatch,
    ForwardMode,
    SpecInfo,
    TargetVerifySpec,
)
from eagletree.domain.tree import TreeMaskMode
from tests.batch_widths import fixed_width

from .strategies import DEVICES


def make_batch(
    mode: ForwardMode, bs: int, tokens_per_request: int, spec: SpecInfo | None = None
) -> ForwardBatch:
    num_tokens = bs * tokens_per_request
    return ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        positions=torch.zeros(num_tokens, dtype=torch.int64),
        seq_lens=torch.full((bs,), 5, dtype=torch.int64),
        req_pool_indices=torch.arange(bs),
        out_cache_loc=torch.arange(1, num_tokens + 1),
        spec=spec,
    )


def test_tokens_per_request_follows_the_mode_and_its_spec() -> None:
    bs, n, k = 3, 8, 4
    verify = TargetVerifySpec(
        num_draft_tokens=n,
        tree_mask=torch.ones(bs * n * n, dtype=torch.bool),
        mask_mode=TreeMaskMode.QLEN_ONLY,
        mask_indptr=torch.arange(bs + 1) * n * n,
    )
    draft = DraftDecodeSpec(topk=k, ancestor_slots=torch.empty((bs * k, 0), dtype=torch.int64))
    extend = DraftExtendSpec(num_tokens_per_request=n)
    cases = [
        (ForwardMode.DECODE, 1, None),
        (ForwardMode.TARGET_VERIFY, n, verify),
        (ForwardMode.DRAFT_DECODE, k, draft),
        (ForwardMode.DRAFT_EXTEND, n, extend),
    ]
    for mode, width, spec in cases:
        batch = make_batch(mode, bs, width, spec)
        assert fixed_width(batch) == width
        assert batch.batch_size == bs
        assert batch.num_tokens == bs * width


def test_an_extend_batch_has_no_fixed_width() -> None:
    batch = make_batch(ForwardMode.EXTEND, 2, 3)
    with pytest.raises(ValueError, match="EXTEND"):
        fixed_width(batch)


@pytest.mark.parametrize("device", DEVICES)
def test_the_idle_batch_is_empty_on_its_device_with_a_host_length_sum_of_zero(device: str) -> None:
    batch = ForwardBatch.idle(device)
    assert batch.mode is ForwardMode.IDLE
    assert batch.batch_size == 0 and batch.num_tokens == 0
    assert fixed_width(batch) == 0
    assert batch.seq_lens_sum == 0
    assert batch.seq_lens_cpu is not None and batch.seq_lens_cpu.device.type == "cpu"
    assert batch.seq_lens_cpu.shape == (0,)
    for t in (batch.input_ids, batch.positions, batch.seq_lens, batch.req_pool_indices):
        assert t.shape == (0,) and t.dtype == torch.int64 and t.device.type == device
    assert batch.out_cache_loc.shape == (0,)
    assert batch.spec is None and batch.extend_lens is None


def test_forward_batch_and_specs_are_frozen() -> None:
    batch = ForwardBatch.idle()
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.mode = ForwardMode.DECODE  # type: ignore[misc]
    spec = DraftExtendSpec(num_tokens_per_request=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_tokens_per_request = 5  # type: ignore[misc]
