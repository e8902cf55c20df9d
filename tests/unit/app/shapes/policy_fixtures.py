"""What the adaptive policy's tests share: a chain S3 against plain, a table where a chain step
costs two plain ones, a pessimistic prior, fully accepted paths, requests at given temperatures
some tokens into their outputs, and a one-bucket cost table from each shape's seconds."""

from __future__ import annotations

from collections.abc import Sequence

from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.domain.draft_shape import PLAIN, DraftShape, RankProfile
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

CHAIN = DraftShape.chain(3)
SHAPES = (CHAIN, PLAIN)
# a chain step costs two plain steps: it pays when it commits more than two tokens
COSTS = StepCosts(
    (1, 8),
    {(s, b, sampled): (2.0 if s == CHAIN else 1.0) for s in SHAPES for b in (1, 8)
     for sampled in (False, True)},
)  # fmt: skip
PESSIMISTIC = RankProfile(((0.2,),))  # the chain would commit 1.25 tokens: plain wins
ACCEPTING = [[0, 0, 0, 1, 1, 1]]  # every draft of a chain S3 accepted
REJECTING = [[-1, -1, -1, 1, 0, 0]]  # a chain S3's first draft refused: nothing accepted


def costs_of(table: dict[DraftShape, float]) -> StepCosts:
    """A cost table of one bucket (bs 1) where each shape's step takes ``table[shape]`` seconds,
    greedy or sampled."""
    return StepCosts((1,), {(s, 1, b): table[s] for s in table for b in (False, True)})


def requests_at(temperatures: Sequence[float], generated: int = 16) -> list[Request]:
    """Requests at ``temperatures``, each ``generated`` output tokens in (by default as many as
    the adaptive policy's calibration waits for: its paths calibrate shapes)."""
    requests = [
        Request(i, [1, 2], SamplingParams(max_new_tokens=64, temperature=t, seed=i), 128)
        for i, t in enumerate(temperatures)
    ]
    for request in requests:
        request.output_ids.extend([3] * generated)
    return requests
