"""The steps the adaptive shape policy runs to learn rather than because they are priced best:
probes of drafting among plain steps, which learn nothing of acceptance, and explorations of
a close runner-up among drafting steps, whose time the start-up table may misjudge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape, ShapeChoice


class Trials:
    """When to probe and what to explore, for ``shapes`` priced by a ``ShapeChoice`` (every
    candidate's committed tokens per second) and a mask of those short enough to run.

    ``probe_every``: a band whose estimate keeps choosing plain drafts once after that many
    plain steps (``probe_due``); every ``explore_every`` drafting steps a close runner-up
    (within ``explore_margin`` of the choice) not timed at the batch's size is explored
    (``untried_near``; the policy runs it two steps), each shape at a bucket ever more rarely
    while the choice stands."""

    def __init__(
        self,
        shapes: Sequence[DraftShape],
        *,
        probe_every: int = 16,
        explore_every: int = 16,
        explore_margin: float = 0.2,
    ) -> None:
        self.shapes = tuple(shapes)
        self._probe_every = probe_every
        self._probe_interval: dict[str, int] = {}
        self._plain_steps: Counter[str] = Counter()
        self._explore_every = explore_every
        self._explore_margin = explore_margin
        self._unexplored_steps = 0
        self._drafting_steps = 0
        # per (shape, bucket): the drafting steps before which it is not explored again, and
        # the wait after its next exploration (both dropped when the choice changes)
        self._explore_after: dict[tuple[DraftShape, int], int] = {}
        self._explore_interval: dict[tuple[DraftShape, int], int] = {}
        self._choice: DraftShape | None = None

    def probe_due(self, bands: Sequence[str], choice: ShapeChoice, short: Sequence[bool]) -> bool:
        """Whether a plain step should draft instead, to learn: a plain step observes nothing,
        so a band whose estimate says plain would never learn otherwise that drafting pays
        (a pessimistic prior, text that became predictable). Every ``probe_every`` plain steps
        of a band, doubling after each probe up to 16 times that while drafting is priced
        well below plain, so that a band where plain stays right spends few steps on probes;
        not while it is near (``drafting_near``): there the estimate, learned from the probes
        alone, decides between two close rates, and probes thinned out leave an estimate that
        fell below plain there for hundreds of steps (an estimate that rose is corrected at
        once by the drafting steps it chooses). On the H100's T 1 batch of one, chain S3
        1.03 x plain, a replay kept 83 % of its steps plain this way."""
        due = False
        for band in bands:
            self._plain_steps[band] += 1
            interval = self._probe_interval.get(band, self._probe_every)
            if self._plain_steps[band] >= interval:
                self._plain_steps[band] = 0
                if not self.drafting_near(choice, short):
                    self._probe_interval[band] = min(2 * interval, 16 * self._probe_every)
                due = True
        return due

    def probe_no_sooner_than(self, plain_steps: int) -> None:
        """Probe after at least ``plain_steps`` plain steps: the draft's lag holds that many,
        and a probe catches the draft up first, a catch-up that costs one draft forward however
        full the lag is (on the H100 the real pair's, with a lag of 32: 0.20 ms over a plain
        step at bs 64 either way). Probes every 16 steps with a lag of 32 would pay a catch-up
        per 16 plain steps where the lag needs one per 32."""
        self._probe_every = max(self._probe_every, plain_steps)

    def drafting_on_merit(self, band: str) -> None:
        """``band`` drafts because drafting was priced best: probe soon again if it stops."""
        self._probe_interval[band] = self._probe_every

    def drafting_near(self, choice: ShapeChoice, short: Sequence[bool]) -> bool:
        """Whether the best drafting shape short enough to run is priced within
        ``explore_margin`` of the choice's tokens per second."""
        return any(not shape.is_plain for _, shape, _ in self._near(choice, short))

    def chose(self, shape: DraftShape) -> None:
        """The pricing chose drafting ``shape`` for this step: another choice than the last
        starts every exploration's wait afresh."""
        if shape != self._choice:
            self._choice = shape
            self._explore_after.clear()
            self._explore_interval.clear()

    def explore_due(self) -> bool:
        """Every ``explore_every`` drafting steps (``untried_near``)."""
        self._drafting_steps += 1
        self._unexplored_steps += 1
        if self._unexplored_steps < self._explore_every:
            return False
        self._unexplored_steps = 0
        return True

    def untried_near(
        self,
        choice: ShapeChoice,
        short: Sequence[bool],
        observations: Callable[[DraftShape], int],
        bucket: int,
    ) -> DraftShape | None:
        """The best-looking drafting shape other than the choice whose steps were timed fewer
        than twice (``observations``: at this batch's ``bucket`` and sampling), if its estimate
        is within ``explore_margin`` of the choice's: until it runs, its time is the start-up
        table's guess, which can rank two close shapes wrongly (two steps of it settle that, at
        a cost of that margin at most). Never plain: a lone plain step among drafting ones is
        not timed (it pays their host work, ``LearnedCosts``), so it stayed untried and ran
        every ``explore_every`` steps for good, each with the catch-up the next drafting step
        needs (on the H100, T 1, bs 8–64: a plain step and a catch-up every 16 chain S3 steps; at
        bs 64 1.34 ms for 2 tokens where chain S3 committed them in 1.17). A shape's times go
        stale after a while (``LearnedCosts``), so a runner-up the choice stays ahead of is
        explored again: after ``explore_every`` drafting steps, then twice that, up to 16 times
        (on the H100 chain S5 ran every 16th step among chain S3 ones for whole T 1 and T 0.7
        cells, 0.85 x as fast there)."""
        now = self._drafting_steps
        near = [
            (rate, -i)
            for i, shape, rate in self._near(choice, short)
            if shape != choice.shape
            and not shape.is_plain
            and observations(shape) < 2
            and now >= self._explore_after.get((shape, bucket), 0)
        ]
        if not near:
            return None
        shape = self.shapes[-max(near)[1]]
        interval = self._explore_interval.get((shape, bucket), self._explore_every)
        self._explore_after[shape, bucket] = now + interval
        self._explore_interval[shape, bucket] = min(2 * interval, 16 * self._explore_every)
        return shape

    def _near(
        self, choice: ShapeChoice, short: Sequence[bool]
    ) -> Iterator[tuple[int, DraftShape, float]]:
        """(index, shape, tokens per second) of every candidate short enough to run and priced
        within ``explore_margin`` of the choice."""
        floor = (1.0 - self._explore_margin) * choice.tokens_per_second
        for i, (shape, rate, ok) in enumerate(zip(self.shapes, choice.rates, short, strict=True)):
            if ok and rate >= floor:
                yield i, shape, rate
