"""Application: what `eagletree bench` reads from an adaptive engine — the steps each shape ran
(and which one each timed step launched), and, after its windows, the step costs it measured
and learned and the rank profiles it learned, with a chain's line rates (the JSON's
``adaptive``, which ``benchmarks/projected.py`` applies to another cost table)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.speculative_worker import SpeculativeWorker

if TYPE_CHECKING:
    from eagletree.app.engine.loop import Engine
    from eagletree.domain.draft_shape import DraftShape


def _adaptive_policy(engine: Engine) -> tuple[SpeculativeWorker, AdaptiveShapes] | None:
    """The engine's speculative worker and its adaptive policy, or None for any other engine."""
    worker = engine.worker
    if isinstance(worker, SpeculativeWorker) and isinstance(worker.policy, AdaptiveShapes):
        return worker, worker.policy
    return None


def adaptive_state(engine: Engine) -> dict[str, Any] | None:
    """An adaptive engine's step costs (ms per step, per shape, bucket and sampling: as
    measured at start and as learned from its steps; a plain step's, its share of a run of
    plain steps with their catch-ups), its catch-up step as measured at start (one every
    ``every`` plain steps), its learned rank profiles per band and the head's own it started
    from; None for any other engine."""
    adaptive = _adaptive_policy(engine)
    if adaptive is None:
        return None
    policy = adaptive[1]
    costs = policy.costs
    rows = []
    if costs is not None:
        for shape, bucket, sampled in costs.measured.seconds:
            rows.append(
                {
                    "shape": shape.label,
                    "num_steps": shape.num_steps,
                    "topk": shape.topk,
                    "num_draft_tokens": shape.num_draft_tokens,
                    "bucket": bucket,
                    "sampled": sampled,
                    "measured_ms": 1e3 * costs.measured_of(shape, bucket, sampled),
                    "learned_ms": 1e3 * costs.of(shape, bucket, sampled),
                }
            )
    catch_ups = []
    if costs is not None:
        every = costs.measured.catch_up_every
        for (bucket, sampled), seconds in costs.measured.catch_up.items():
            catch_ups.append(
                {"bucket": bucket, "sampled": sampled, "measured_ms": 1e3 * seconds, "every": every}
            )
    learned = policy.learned_profiles()
    profiles = {band: [list(row) for row in profile.hit_rates] for band, profile in learned.items()}
    lines = {band: list(profile.line_rates) for band, profile in learned.items()}
    # what the bands started from, as the head's report gives it (a replay starts there too)
    priors = policy.acceptance.head_priors
    return {
        "step_costs": rows,
        "catch_ups": catch_ups,
        "rank_profiles": profiles,
        "line_rates": lines,
        "head_priors": {name: [list(row) for row in p.hit_rates] for name, p in priors.items()},
    }


def policy_view(engine: Engine, batch_size: int, temperature: float) -> dict[str, Any]:
    """What an adaptive engine's policy now believes of a batch of ``batch_size`` requests at
    ``temperature``, per candidate: the tokens a step commits as the policy prices it (the
    band's learned profile, a tree's calibrated by its own steps), as the profile alone models
    them (``model_tokens_per_step``) and the ms a step costs by its learned costs (empty for
    any other engine): beside the row's measured tokens per step and ms per step, where its
    choice went wrong."""
    adaptive = _adaptive_policy(engine)
    if adaptive is None:
        return {}
    policy = adaptive[1]
    costs = policy.costs
    if costs is None:
        return {}
    expected = policy.expected_accepted(temperature)
    modelled = policy.expected_accepted(temperature, calibrated=False)
    sampled = temperature > 0
    return {
        shape.label: {
            "tokens_per_step": 1.0 + accepted,
            "model_tokens_per_step": 1.0 + model,
            "ms": 1e3 * costs.of(shape, batch_size, sampled),
        }
        for shape, accepted, model in zip(policy.shapes, expected, modelled, strict=True)
    }


# how a timed step that caught the draft up over its lag is named among the shapes
CATCH_UP = "plain catch-up"


def last_shape(engine: Engine) -> str | None:
    """The shape of the latest decode step an adaptive engine launched, ``CATCH_UP`` where it
    was a plain step that caught the draft up (None for any other engine, or before its
    first)."""
    adaptive = _adaptive_policy(engine)
    worker = None if adaptive is None else adaptive[0]
    if worker is None or worker.last_shape is None:
        return None
    return CATCH_UP if worker.last_caught_up else worker.last_shape.label


def shape_steps(engine: Engine) -> Counter[DraftShape]:
    """The steps of each shape an adaptive worker ran so far (empty for a fixed one)."""
    adaptive = _adaptive_policy(engine)
    return Counter() if adaptive is None else adaptive[0].shape_steps
