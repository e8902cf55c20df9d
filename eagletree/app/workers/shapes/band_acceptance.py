"""What a request is expected to accept, by its temperature band: ``BandAcceptance`` learns a
rank profile per band (greedy, or the band of its temperature) from the accepted paths read
back, and keeps every candidate shape's expected accepted drafts under it, recomputed on a
cadence that thins as the estimate settles and at once when it drifts. The adaptive shape
policy (``adaptive``) prices a batch's shapes by these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from eagletree.domain.acceptance_calibration import AcceptanceCalibration
from eagletree.domain.acceptance_profile import AcceptanceProfile
from eagletree.domain.draft_shape import (
    RankProfile,
    expected_accepted,
    mean_profile,
    with_lower_ranks,
)

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.domain.request import Request

# a head nobody measured yet: the rank profile the first steps assume (greedy drafting of a
# trained head accepts its top candidate about two times in three)
DEFAULT_PRIOR = RankProfile(((0.65, 0.12, 0.05), (0.6, 0.12, 0.05)))

# a path read back: the rank accepted at each depth, then the ranks offered there
RankedPath = tuple[Sequence[int], Sequence[int]]


def temperature_band(request: Request) -> str:
    """The class whose acceptance a request shares: greedy, or its temperature's band."""
    return band_of(request.params.temperature)


def band_of(temperature: float) -> str:
    """``greedy`` at 0, else the band of ``temperature``: T<=0.5, T<=0.85 or T>0.85."""
    if temperature <= 0:
        return "greedy"
    return "T<=0.5" if temperature <= 0.5 else "T<=0.85" if temperature <= 0.85 else "T>0.85"


def drawn_band(band: str) -> str:
    """The class of ``band``'s requests where they draw their drafts: accepted by rejection
    sampling, not at the target's probability of the draft's top tokens, so learned apart
    (``draft_draws``)."""
    return f"{band} drawn"


class BandAcceptance:
    """Per band, a learned rank profile and each of ``shapes``' expected accepted drafts.

    ``prior``: the rank profile assumed before any path of a band was read (it weighs as
    ``prior_weight`` observed steps); ``head_priors``: the head's own, measured when it was
    trained (``greedy`` and ``sampled``, at T 1, and ``drawn``, a T 1 draft drawn from the
    head), which replace it: greedy and T ≤ 0.5 requests start from the greedy one, T > 0.85
    from the sampled one (their drawn drafts from the drawn one), those between from the
    means. Expected tokens are recomputed after ``refresh_steps`` steps of a band were
    recorded (a record of one step in several counting them all, a step of fewer paths than
    a full sample its share), then after twice as many, up to 16 times as many (a tree's
    expected tokens cost the host a tenth of a millisecond per shape and band; a settled
    estimate moves slowly), at once when ``record`` is told to (a
    probe was read back), and at once with the cadence restarted when the rank-0 chain's
    expected accepted drafts moved by ``drift`` (relative;
    ``_drifted``). Each tree's expectation is scaled by what its own steps accepted against
    it (``AcceptanceCalibration``, per band): the profile's static tree misses what a step's
    tree, cut from that step's scores, gains or loses. A chain's is not: its drafts are the
    rank-0 line, whose rates the profile counts apart, so its model is what its steps accept on
    average, and a factor could only add *when* it ran (the policy drafts deep chains where the
    recent paths went deep and short ones where they did not: against the model of the moment
    the short chain was priced below what it accepts, docs/speculative.md).
    """

    def __init__(
        self,
        shapes: Sequence[DraftShape],
        *,
        prior: RankProfile = DEFAULT_PRIOR,
        head_priors: Mapping[str, RankProfile] | None = None,
        prior_weight: float = 4.0,
        refresh_steps: int = 4,
        drift: float = 0.1,
        calibration_weight: float = 16.0,
    ) -> None:
        self.shapes = tuple(shapes)
        self._calibration_weight = calibration_weight
        self._prior = prior
        self._head_priors = dict(head_priors or {})
        self._prior_weight = prior_weight
        self._refresh_steps = refresh_steps
        self._drift = drift
        self._depth = max(s.num_steps for s in self.shapes)
        self._rank = max(s.topk for s in self.shapes)
        self._profiles: dict[str, AcceptanceProfile] = {}
        self._stale: dict[str, float] = {}  # per band, the steps recorded since its refresh
        self._refreshes: Counter[str] = Counter()
        self._expected: dict[str, list[float | None]] = {}  # per band, per shape
        self._refreshed_at: dict[str, float] = {}  # per band, at its last refresh
        self._calibration: dict[str, AcceptanceCalibration] = {}

    def profile(self, band: str) -> RankProfile:
        """The rank profile learned for ``band`` (its prior before any of its paths)."""
        learned = self._profiles.get(band)
        return self._prior_of(band) if learned is None else learned.profile()

    def learned(self, band: str) -> AcceptanceProfile | None:
        """The counts learned for ``band``, if any of its paths was recorded."""
        return self._profiles.get(band)

    def learned_profiles(self) -> dict[str, RankProfile]:
        """The rank profile of every band a path was recorded for."""
        return {band: learned.profile() for band, learned in self._profiles.items()}

    @property
    def head_priors(self) -> dict[str, RankProfile]:
        """The head's own rank profiles the bands start from, by class (empty: the default
        prior)."""
        return dict(self._head_priors)

    def record(
        self,
        band: str,
        paths: Sequence[RankedPath],
        *,
        refresh: bool = False,
        shape: int | None = None,
        starting: Sequence[RankedPath] = (),
        steps: float = 1.0,
    ) -> bool:
        """One step's ``paths`` of ``band``'s requests, of ``shapes[shape]`` if given (a tree's
        calibration then compares them with what its model expected of them); ``starting``:
        more of the step's paths, of requests in their first tokens, which the profile learns
        from and the calibration does not; ``steps``: the steps this record stands for
        (``AcceptanceProfile.record``; in steps of a full sample, ``HostCadence.sample``).
        Returns whether its expected tokens are to be recomputed before they are next read:
        the estimate drifted, or ``refresh``."""
        # a tree's steps calibrate it: what the model expects of it before the profile learns
        # these paths
        tree = shape if shape is not None and paths and self.shapes[shape].topk > 1 else None
        modelled = self._modelled(band, tree) if tree is not None else 0.0
        profile = self._profiles.get(band)
        if profile is None:
            profile = AcceptanceProfile(
                self._depth, self._rank, self._prior_of(band), prior_weight=self._prior_weight
            )
            self._profiles[band] = profile
        accepted = profile.record(paths, steps=steps)
        if starting:
            profile.record(starting, steps=0)
        if tree is not None:
            calibration = self._calibration.get(band)
            if calibration is None:
                calibration = self._calibration[band] = AcceptanceCalibration(
                    len(self.shapes), prior_weight=self._calibration_weight
                )
            calibration.record(tree, accepted, modelled, len(paths))
        self._stale[band] = self._stale.get(band, 0.0) + steps
        drifted = self._drifted(band, profile)
        if drifted:  # new text, new requests: follow them closely
            self._refreshes[band] = 0
        if drifted or refresh:
            self._stale[band] = self._refresh_threshold(band)
            return True
        return False

    def expected(
        self, band: str, wanted: Sequence[int], *, calibrated: bool = True
    ) -> list[float | None]:
        """Expected accepted drafts per shape for a request of ``band`` (cached), known at
        least for the shapes at indices ``wanted``: those a batch can run (a wide tree costs
        the most to compute, and past the policy's stall ratio at a batch's size it is never
        priced there); not ``calibrated``: as the profile's model alone expects them."""
        cached = self._expected.get(band)
        if cached is None or self._stale.get(band, 0.0) >= self._refresh_threshold(band):
            # what drift is measured from: the prior's too, so that a band's first paths, which
            # can move it far off the prior that priced the batch, price it again at once
            learned = self._profiles.get(band)
            if learned is not None:
                rates = learned.top_rates()
            else:
                prior = self._prior_of(band)
                rates = [prior.rate(d, 0) for d in range(self._depth)]
            self._refreshed_at[band] = _chain_expectation(rates)
            if band in self._expected:
                self._refreshes[band] += 1
            cached = self._expected[band] = [None] * len(self.shapes)
            self._stale[band] = 0
        missing = [i for i in wanted if cached[i] is None]
        if missing:
            profile = self.profile(band)
            for i in missing:
                cached[i] = expected_accepted(self.shapes[i], profile)
        calibration = self._calibration.get(band)
        if calibration is None or not calibrated:
            return cached
        # a mean of what the shape's steps accepted and of the model, weighted by their
        # requests and the prior: never past the most a step of the shape can accept
        return [None if e is None else e * calibration.factor(i, e) for i, e in enumerate(cached)]

    def _modelled(self, band: str, shape: int) -> float:
        """The uncalibrated expectation of ``shapes[shape]`` for ``band`` as it now stands."""
        cached = self._expected.get(band)
        known = None if cached is None else cached[shape]
        return expected_accepted(self.shapes[shape], self.profile(band)) if known is None else known

    def _prior_of(self, band: str) -> RankProfile:
        greedy = self._head_priors.get("greedy", self._prior)
        sampled = self._head_priors.get("sampled", self._prior)
        # a drawn draft at T 1 is accepted with 1 − TV(p, q): the head's own measure where its
        # report has one (of its first draws; ranks beyond them are taken from the T 1 top-k
        # profile), else between a greedy and a T 1 argmax chain
        measured = self._head_priors.get("drawn")
        if measured is None:
            drawn = mean_profile(greedy, sampled)
        else:
            drawn = with_lower_ranks(measured, sampled)
        if band in ("greedy", "T<=0.5", drawn_band("T<=0.5")):
            return greedy
        if band == "T>0.85":
            return sampled
        if band == drawn_band("T>0.85"):
            return drawn
        if band == drawn_band("T<=0.85"):
            return mean_profile(greedy, drawn)
        # T 0.5–0.85 accepts between the two: on the H200's real pair a T 0.7 tree committed
        # 4.3 tokens a step, T 0 5.8, T 1 2.9; from the T 1 profile alone, a lone T 0.7
        # request kept to plain steps (probes move a prior of weight 4 one path at a time)
        return mean_profile(greedy, sampled)

    def _drifted(self, band: str, profile: AcceptanceProfile) -> bool:
        """Whether the band's profile moved past ``drift`` since its expected tokens were last
        computed: the rank-0 chain through every depth, the estimate's bulk, expects that
        much more or fewer accepted drafts (relative). A refresh cadence grown to 64 steps
        would otherwise price a new batch by the last one's acceptance for that long."""
        then = self._refreshed_at.get(band)
        if then is None:
            return False
        now = _chain_expectation(profile.top_rates())
        return abs(now - then) > self._drift * max(then, 1e-3)

    def _refresh_threshold(self, band: str) -> int:
        return self._refresh_steps << min(self._refreshes[band], 4)


def _chain_expectation(top_rates: Sequence[float]) -> float:
    """Expected accepted drafts of a chain through every depth: Σ_d Π_{e ≤ d} r_e."""
    total, reach = 0.0, 1.0
    for rate in top_rates:
        reach *= rate
        total += reach
    return total
