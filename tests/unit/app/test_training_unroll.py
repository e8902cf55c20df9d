"""The unrolled training forward against drafting done step by step, as the engine drafts.

Reference: for an anchor a, step 0 runs causally over positions 0..a; each later step drafts one
row at position a + s that reads its parent's output and attends to the step-0 prefix plus the
rows its own chain wrote. The unrolled forward must give, at step s and row a + s, that row.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagletree.app.training.head_modules import HeadShape, Rope, init_linear_weights
from eagletree.app.training.heads import (
    DraftHead,
    Eagle3Head,
    EagleHead,
    unrolled_attention_mask,
    unrolled_forward,
)

SHAPE = HeadShape(
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
SEQ_LEN, NUM_STEPS, BATCH = 11, 4, 2


def _rows(rope: Rope, start: int, stop: int) -> Rope:
    return Rope(rope.cos[start:stop], rope.sin[start:stop])


def drafted_chain(
    head: DraftHead, embeds: torch.Tensor, features: torch.Tensor, anchor: int, num_steps: int
) -> list[torch.Tensor]:
    """Outputs (batch, H) of the chain from ``anchor``: step 0 at the anchor, then one per step."""
    rope = Rope.of(SEQ_LEN, SHAPE.head_dim, SHAPE.rope_theta, embeds.device)
    caches = head.new_caches()
    prefix = anchor + 1
    causal = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    out = head.step(
        embeds[:, :prefix], features[:, :prefix], True, _rows(rope, 0, prefix), caches, causal
    )
    outputs = [out[:, anchor]]
    parent = out[:, anchor : anchor + 1]
    for step in range(1, num_steps):
        position = anchor + step
        keys_so_far = sum(k.shape[2] for k in caches[0].keys)
        everything = torch.ones(1, keys_so_far + 1, dtype=torch.bool)
        out = head.step(
            embeds[:, position : position + 1],
            parent,
            False,
            _rows(rope, position, position + 1),
            caches,
            everything,
        )
        outputs.append(out[:, 0])
        parent = out
    return outputs


def make_head(kind: str) -> tuple[DraftHead, int]:
    torch.manual_seed(0)
    head: EagleHead | Eagle3Head
    if kind == "eagle":
        head = EagleHead(SHAPE, num_layers=2, lm_head=nn.Linear(SHAPE.hidden_size, 40, bias=False))
        width = SHAPE.hidden_size
    else:
        head = Eagle3Head(SHAPE, num_aux=3, draft_vocab_size=24)
        width = 3 * SHAPE.hidden_size
    init_linear_weights(head, std=0.2)
    # float64: the two orders of summation differ by ~1e-5 in float32 after four steps
    head.double()
    if isinstance(head, EagleHead):
        head._lm_head[0].double()
    return head, width


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_each_unrolled_step_equals_the_chain_drafted_row_by_row(kind: str) -> None:
    head, width = make_head(kind)
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(BATCH, SEQ_LEN, SHAPE.hidden_size, generator=generator).double()
    features = torch.randn(BATCH, SEQ_LEN, width, generator=generator).double()
    with torch.no_grad():
        unrolled = unrolled_forward(head, embeds, features, NUM_STEPS)
        for anchor in range(SEQ_LEN - NUM_STEPS + 1):
            chain = drafted_chain(head, embeds, features, anchor, NUM_STEPS)
            for step, expected in enumerate(chain):
                actual = unrolled[step][:, anchor + step]
                torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def test_the_mask_holds_the_prefix_and_one_key_per_earlier_step() -> None:
    mask = unrolled_attention_mask(6, 2, torch.device("cpu"))
    assert mask.shape == (6, 18)
    q = 4  # anchor 2: prefix 0..2, then its depth-1 node at 3 and itself at 4
    assert mask[q, :6].tolist() == [True, True, True, False, False, False]
    assert mask[q, 6:12].nonzero().flatten().tolist() == [3]
    assert mask[q, 12:].nonzero().flatten().tolist() == [4]
    assert bool(mask.any(dim=1).all())  # no empty row, even without a prefix
