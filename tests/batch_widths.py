"""Test support: how many new tokens each request brings to a fixed-width forward.

The oracles and attention cases split a batch's token rows by request; the engine never needs
to, so the rule lives here: a fixed-width mode's width is in its spec (DECODE: 1, IDLE: 0).
"""

from __future__ import annotations

from eagletree.domain.batch import (
    DraftDecodeSpec,
    DraftExtendSpec,
    ForwardBatch,
    ForwardMode,
    TargetVerifySpec,
)


def fixed_width(batch: ForwardBatch) -> int:
    """New tokens per request of ``batch`` in a fixed-width mode (EXTEND has no fixed width:
    ValueError)."""
    if batch.mode is ForwardMode.DECODE:
        return 1
    if isinstance(batch.spec, TargetVerifySpec):
        return batch.spec.num_draft_tokens
    if isinstance(batch.spec, DraftDecodeSpec):
        return batch.spec.topk
    if isinstance(batch.spec, DraftExtendSpec):
        return batch.spec.num_tokens_per_request
    if batch.mode is ForwardMode.IDLE:
        return 0
    raise ValueError(f"{batch.mode.name} batch has no fixed width (spec={batch.spec!r})")
