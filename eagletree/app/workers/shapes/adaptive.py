"""The adaptive shape policy: ``AdaptiveShapes`` chooses, for every step, the candidate shape
(plain decoding included) that commits the most tokens per second for the batch at hand: each
request's expected accepted drafts under a shape come from the rank profile of its class
(greedy, or its temperature band), learned from the steps committed so far
(``band_acceptance``); a shape's time comes from the step costs measured at start
(``step_costs``), corrected by the seconds the engine's steps took (``learned_costs``). The
choice is made on the host from what was read back — with overlap, statistics through the step
before the one in flight — so it never waits for the device.
Whatever it chooses, the step is the same lossless verification (docs/speculative.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagletree.app.workers.shapes.band_acceptance import (
    DEFAULT_PRIOR,
    BandAcceptance,
    RankedPath,
    band_of,
    drawn_band,
    temperature_band,
)
from eagletree.app.workers.shapes.host_cadence import HostCadence
from eagletree.app.workers.shapes.learned_costs import WARM_AFTER, LearnedCosts
from eagletree.app.workers.shapes.step_costs import StepCosts
from eagletree.app.workers.shapes.trials import Trials
from eagletree.domain.draft_shape import ShapeChoice, choose_shape

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape, RankProfile
    from eagletree.domain.request import Request


@dataclass(slots=True)
class _Pricing:
    """One pricing of the candidates for a batch, and the steps it has stood for."""

    choice: ShapeChoice  # its rates: every candidate's, 0 for those past the stall ratio
    bands: list[str]
    sampled: bool
    batch_size: int
    bucket: int  # the costs' bucket of batch_size
    short: list[bool]  # per candidate: whether its step is short enough to run at all
    age: int = 0


class AdaptiveShapes:
    """The fastest of ``shapes`` for each batch, from measured costs and learned acceptance;
    docs/speculative.md says why each rule is as it is, with the runs that showed it.

    ``hysteresis``: another shape is taken only when it is that fraction faster than the
    current one (none by default: the estimates are smoothed and a pricing stands for
    ``reprice_every`` steps). ``prior``, ``head_priors``, ``prior_weight``, ``refresh_steps``,
    ``drift``, ``calibration_weight``: what a request of each temperature band is expected to
    accept (``BandAcceptance``); ``settle_tokens``: the output tokens before which a request's
    paths teach its band's profile but calibrate no shape (its first steps continue a prompt
    cut anywhere). ``probe_every``: a band whose estimate keeps choosing plain drafts once after
    that many plain steps, or the draft's lag where longer (``Trials.probe_due``).
    ``explore_every``: a close drafting runner-up not timed at the batch's size runs two steps
    after that many drafting steps (the first, right after a switch, teaches no time:
    ``LearnedCosts``), ever more rarely while the choice stands (``Trials.untried_near``);
    plain steps explore nothing and plain is never explored (from plain a drafting step also
    pays a catch-up; a lone plain step among drafting ones teaches no time).
    ``observe_per_step`` requests are recorded a step (a step of fewer counts as that share
    of one: the profiles forget by paths read) and
    ``rows_per_stride`` spreads a pricing and a record over more steps in a larger batch
    (``HostCadence``). The shapes are priced again every ``reprice_every`` steps, when the batch
    moves to another bucket of the step costs and after a probe is read back: pricing every
    candidate is most of the policy's host time, and within a bucket every shape's step costs
    the same. No step runs a shape — chosen, probed or explored — priced above
    ``stall_ratio`` × the cheapest candidate's step at the batch's size, or × the median of
    the last steps taken there where that is longer (``LearnedCosts.median_step``), so no
    request's worst step reaches 3 × its median. ``drawn_drafts``: the worker's sampling
    requests draw their drafts and accept by rejection sampling, so a band's shapes are priced
    by what its drawn drafts accepted (``drawn_band``), learned apart from top-k drafts'."""

    observes = True

    def __init__(
        self,
        shapes: Sequence[DraftShape],
        *,
        prior: RankProfile = DEFAULT_PRIOR,
        head_priors: Mapping[str, RankProfile] | None = None,
        prior_weight: float = 4.0,
        hysteresis: float = 0.0,
        refresh_steps: int = 4,
        probe_every: int = 16,
        observe_per_step: int = 4,
        explore_every: int = 16,
        explore_margin: float = 0.2,
        reprice_every: int = 4,
        stall_ratio: float = 2.5,
        drift: float = 0.1,
        drawn_drafts: bool = False,
        calibration_weight: float = 16.0,
        settle_tokens: int = 16,
        rows_per_stride: int = 16,
    ) -> None:
        if not shapes:
            raise ValueError("an adaptive policy needs at least one shape")
        self.shapes = tuple(shapes)
        self._index = {shape: i for i, shape in enumerate(self.shapes)}
        self.acceptance = BandAcceptance(
            self.shapes,
            prior=prior,
            head_priors=head_priors,
            prior_weight=prior_weight,
            refresh_steps=refresh_steps,
            drift=drift,
            calibration_weight=calibration_weight,
        )
        self._hysteresis = hysteresis
        self._costs: LearnedCosts | None = None
        self._current = self.shapes[0]
        self._trials = Trials(
            self.shapes,
            probe_every=probe_every,
            explore_every=explore_every,
            explore_margin=explore_margin,
        )
        self._probe: DraftShape | None = None  # a probe chosen and not yet read back
        self._exploring: DraftShape | None = None  # an exploration's shape, for its second step
        self._reprice_every = reprice_every
        self._cadence = HostCadence(
            observe_per_step=observe_per_step, rows_per_stride=rows_per_stride
        )
        self._priced: _Pricing | None = None
        # per batch size, its costs' bucket and the steps a pricing stands for (read every step)
        self._by_size: dict[int, tuple[int, int]] = {}
        self._stall_ratio = stall_ratio
        self._drawn = drawn_drafts  # sampling requests' rates learned apart (``drawn_band``)
        self._settle_tokens = settle_tokens

    @property
    def costs(self) -> LearnedCosts | None:
        return self._costs

    def use_costs(self, costs: StepCosts, *, warm_after: int = WARM_AFTER) -> None:
        """Price the shapes by ``costs`` from now on, as the steps' times correct them (until
        then, every step is the default); the first ``warm_after`` steps at each bucket and
        sampling are not learned from (``LearnedCosts``). Probes come no sooner than the draft's
        lag fills (``Trials.probe_no_sooner_than``)."""
        self._costs = LearnedCosts(costs, warm_after=warm_after)
        self._by_size.clear()  # its buckets may be others
        if costs.catch_up:
            self._trials.probe_no_sooner_than(costs.catch_up_every)

    def observe_time(
        self,
        shape: DraftShape,
        batch_size: int,
        sampled: bool,
        seconds: float,
        *,
        catch_up: bool = False,
    ) -> None:
        if self._costs is not None:
            self._costs.record(shape, batch_size, sampled, seconds, catch_up=catch_up)

    def profile(self, band: str) -> RankProfile:
        """The rank profile learned for ``band`` (the prior before any of its steps)."""
        return self.acceptance.profile(band)

    def learned_profiles(self) -> dict[str, RankProfile]:
        """The rank profile of every band a step was read back for."""
        return self.acceptance.learned_profiles()

    def expected_accepted(self, temperature: float, *, calibrated: bool = True) -> list[float]:
        """Every candidate's expected accepted drafts a step for a request at ``temperature``,
        as the policy prices them (its drawn class where it draws, each tree calibrated by its
        own steps unless not ``calibrated``)."""
        every = range(len(self.shapes))
        expected = self._expected(band_of(temperature), every, calibrated=calibrated)
        return [_known(e) for e in expected]

    def choose(self, decode: Sequence[Request]) -> DraftShape:
        costs = self._costs
        if not decode or costs is None:
            return self._current
        priced = self._priced
        sized = self._by_size.get(len(decode))
        if sized is None:
            every = self._reprice_every * self._cadence.stride(len(decode))
            sized = self._by_size[len(decode)] = (costs.bucket(len(decode)), every)
        bucket, every = sized
        if priced is None or priced.bucket != bucket or priced.age >= every:
            priced = self._priced = self._price(decode, costs, bucket)
        priced.age += 1
        chosen, bands = priced.choice, priced.bands
        choice = self._current = chosen.shape
        exploring, self._exploring = self._exploring, None
        if choice.is_plain and self._probe is not None:
            choice = self._probe  # until a drafting step is read back (a catch-up may delay it)
        elif choice.is_plain and self._trials.probe_due(bands, chosen, priced.short):
            short = priced.short
            drafting = [i for i, s in enumerate(self.shapes) if not s.is_plain and short[i]]
            if drafting:  # the best drafting shape, once, to see whether speculation pays now
                best = max(drafting, key=lambda i: (chosen.rates[i], -i))
                choice = self._probe = self.shapes[best]
        elif not choice.is_plain:
            self._trials.chose(choice)
            due = self._trials.explore_due()  # every drafting step counts, explored ones too
            if exploring is not None and priced.short[self._index[exploring]]:
                choice = exploring
            elif due:
                size, sampled = priced.batch_size, priced.sampled
                untried = self._trials.untried_near(
                    chosen, priced.short, lambda s: costs.observations(s, size, sampled), bucket
                )
                if untried is not None:
                    choice = self._exploring = untried
        return choice

    def _price(self, decode: Sequence[Request], costs: LearnedCosts, bucket: int) -> _Pricing:
        """Every candidate's committed tokens per second for ``decode`` (of the costs'
        ``bucket``), and the choice. From
        plain steps, a drafting shape's step is priced with half a catch-up's excess over a
        plain step spread over the steps a pricing stands for: the switch runs the catch-up
        first, of which the plain steps' own schedule would have paid part later (on the H200
        a T 1 batch of 8, its drafting shapes within 3 % of plain, went back and forth, each
        return to drafting paying a catch-up: 0.92 x plain with 86 % of its steps plain)."""
        # by temperature first: a batch holds few, and a band per request costs a call each
        counts: Counter[str] = Counter()
        for temperature, count in Counter(r.params.temperature for r in decode).items():
            counts[band_of(temperature)] += count
        bands = list(counts)
        sampled = any(band != "greedy" for band in bands)
        seconds = [costs.of(shape, len(decode), sampled) for shape in self.shapes]
        median = costs.median_step(len(decode), sampled) or 0.0
        limit = self._stall_ratio * max(min(seconds), median)
        short = [s <= limit for s in seconds]
        kept = [i for i, ok in enumerate(short) if ok]
        expected = [self._expected(band, kept) for band in bands]
        step_seconds = [seconds[i] for i in kept]
        if self._current.is_plain:  # a switch to drafting runs a catch-up first (see above)
            switch = 0.5 * costs.catch_up_excess(len(decode), sampled) / self._reprice_every
            step_seconds = [
                t if self.shapes[i].is_plain else t + switch
                for i, t in zip(kept, step_seconds, strict=True)
            ]
        chosen = choose_shape(
            [self.shapes[i] for i in kept],
            step_seconds,
            [[_known(e[i]) for e in expected] for i in kept],
            self._current,
            self._hysteresis,
            counts=[counts[band] for band in bands],
        )
        rates = [0.0] * len(self.shapes)
        for i, rate in zip(kept, chosen.rates, strict=True):
            rates[i] = rate
        choice = ShapeChoice(chosen.shape, chosen.tokens_per_second, tuple(rates))
        return _Pricing(choice, bands, sampled, len(decode), bucket, short)

    def _expected(
        self, band: str, kept: Sequence[int], *, calibrated: bool = True
    ) -> list[float | None]:
        """Every candidate's expected accepted drafts for a request of ``band``, known at
        least at the indices ``kept``, by what the band's drafts accepted as they are made."""
        return self.acceptance.expected(self._learned_band(band), kept, calibrated=calibrated)

    def _learned_band(self, band: str) -> str:
        """The class ``band``'s steps are learned as: its drawn class where sampling requests
        draw their drafts."""
        return drawn_band(band) if self._drawn and band != "greedy" else band

    def observe(
        self, shape: DraftShape, requests: Sequence[Request], paths: Sequence[Sequence[int]]
    ) -> None:
        """Record ``observe_per_step`` requests a step (``HostCadence.sample``): the statistics
        need few paths per step, and recording costs host time every step. A probe's step is
        recorded at once. A request's paths before its first ``settle_tokens`` output tokens
        teach the band's profile, not the shape's calibration (``BandAcceptance.record``'s
        ``starting``)."""
        depth = shape.num_steps
        if depth == 0 or not requests:
            return
        probed, self._probe = self._probe is not None, None
        sample = self._cadence.sample(len(requests), now=probed)
        if sample is None:
            return
        indices, steps = sample
        shape_index = self._index.get(shape)
        # per band: the paths of settled requests, then those of requests in their first tokens
        by_band: dict[str, tuple[list[RankedPath], list[RankedPath]]] = {}
        settle = self._settle_tokens
        for index in indices:
            path, request = paths[index], requests[index]
            settled, starting = by_band.setdefault(temperature_band(request), ([], []))
            kept = settled if len(request.output_ids) >= settle else starting
            kept.append((path[:depth], path[depth : 2 * depth]))
        record = self.acceptance.record
        for band, (settled, starting) in by_band.items():
            # what a probe learned decides the next step; so does a drifted estimate
            learned = self._learned_band(band)
            if record(
                learned,
                settled,
                refresh=probed,
                shape=shape_index,
                starting=starting,
                steps=steps,
            ):
                self._priced = None
            if not self._current.is_plain:  # drafting on merit: probe soon again if it stops
                self._trials.drafting_on_merit(band)


def _known(expected: float | None) -> float:
    assert expected is not None, "a shape priced before its expected tokens were computed"
    return expected
