"""Domain: how far each shape's modelled acceptance is from what its steps accept.

``draft_shape.expected_accepted`` prices a tree by the static tree of a rank profile's
average rates: the N − 1 best products of them. A step's real tree is cut from that step's
own draft scores — deep where the draft is sure, wide where it is not — and accepts more
than the average tree wherever the draft's confidence tracks the target's (on the H200's real
pair at T 0, a tree S5 k4 N16 committed 5.97 tokens a step where the static tree of its
learned profile expected 5.02, while chains matched their model within 1 %); where the
profile's lower ranks, learned only where EAGLE kept them, overstate them, it accepts less.
``AcceptanceCalibration`` keeps, per shape, decayed sums of the drafts its steps' requests
accepted and of those requests: their mean, over what the model expects of a request now,
scales the shape's model. Now, not when the step ran: the profile under the model learns from
the same steps, so a ratio against the model of a step's own time counts the profile's early
error twice once the profile has learned it (in a replay of the H200's real pair at T 1, a
chain S3 whose first steps met a young profile's 2.5 tokens a step was priced at 1.6–1.9 for
60 steps where it committed 2.0, and the batch ran plain and chain S5 instead).
"""

from __future__ import annotations


class AcceptanceCalibration:
    """Per shape (by index), accepted drafts a request, decayed, over the model's.

    ``prior_weight``: requests' worth of agreement with the model each shape starts with, so
    that one step's luck moves its factor little; ``half_life``: the requests recorded of the
    shape's own steps after which a step's weight halves (and, for a shape whose steps accepted
    less than its model, of every other shape's steps too); factors are kept within ``[low,
    high]``. Requests, not steps: a batch of one then measures its shapes over as many paths as
    a large batch (4 recorded a step) does. Counted in steps, it kept an eighth of what a batch
    of 64 kept (then 8 recorded a step): on the H100's real pair at T 0.7, bs 1, each shape was
    priced by its last few dozen steps, chain S3 at 12 % above what its fixed engine committed,
    and a tree whose factor had faded back ran again in bursts of 20–40 steps, 18 % slower than
    chain S5 (the cell 0.95 × chain S5, 37 % of its steps chain S3; replayed, 0.97 and 0.99 with
    requests; on the GPU one call since, another pair, 0.94, within the 0.88–0.99 the cell
    swings by). The cost: with the prior's pull small, a shape that runs is priced by what it
    accepted over its half-life, so after a long run of one request a new batch whose text
    drafts worse is followed more slowly (a chain accepting everything for 200 steps of one
    request, then nothing in a batch of eight: plain after 35 steps, 19 counted in steps).

    Whether a shape is below its model is judged against the model as it stands when read
    (``factor``), as the factor is: judged against the model of its last step, a chain whose
    first steps met a young profile's low rates and accepted more than those stayed unfaded
    when the profile rose above what they accepted — on the H100's real pair at T 0 a chain
    S3 that ran only in the engine's first steps stayed at 0.93 of its model through 1,100 tree
    steps. The fade is so kept as a count of the other shapes' requests since the shape's
    last step, applied where it is read or runs again.
    """

    def __init__(
        self,
        num_shapes: int,
        *,
        prior_weight: float = 16.0,
        half_life: float = 512.0,
        low: float = 0.5,
        high: float = 2.0,
    ) -> None:
        if num_shapes < 1 or prior_weight <= 0 or half_life <= 0 or not 0 < low <= 1 <= high:
            raise ValueError(
                "num_shapes, prior_weight and half_life must be positive and low <= 1 <= high"
            )
        self._decay = 0.5 ** (1.0 / half_life)
        self._prior_weight = prior_weight
        self._low, self._high = low, high
        self._observed = [0.0] * num_shapes
        self._requests = [0.0] * num_shapes
        self._seen = 0  # requests recorded, of every shape
        self._last = [0] * num_shapes  # per shape, ``_seen`` after its last step

    def record(self, shape: int, accepted: float, modelled: float, requests: int) -> None:
        """One step of shape ``shape``: ``requests`` of its requests accepted ``accepted``
        drafts in all, where the model now expects ``modelled`` of each."""
        if requests <= 0 or modelled <= 0:
            return  # nothing to scale: plain, or a model that expects nothing
        observed, counted = self._faded(shape, modelled)
        decay = self._decay**requests
        self._seen += requests
        self._last[shape] = self._seen
        self._observed[shape] = decay * observed + accepted
        self._requests[shape] = decay * counted + requests

    def factor(self, shape: int, modelled: float) -> float:
        """What the model of ``shape``, expecting ``modelled`` drafts a request now, is to be
        multiplied by (1 before any of its steps)."""
        if modelled <= 0:
            return 1.0
        observed, requests = self._faded(shape, modelled)
        if requests <= 0:
            return 1.0
        prior = self._prior_weight
        ratio = (observed + prior * modelled) / ((requests + prior) * modelled)
        return min(max(ratio, self._low), self._high)

    def _faded(self, shape: int, modelled: float) -> tuple[float, float]:
        """The shape's sums of accepted drafts and requests, decayed by every other shape's
        request recorded since its last step where they fall below ``modelled`` a request: so
        priced, it may never run again to say otherwise."""
        observed, requests = self._observed[shape], self._requests[shape]
        others = self._seen - self._last[shape]
        if others and observed < modelled * requests:
            fade = self._decay**others
            return observed * fade, requests * fade
        return observed, requests
