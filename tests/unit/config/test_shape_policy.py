"""speculative.policy and candidate_shapes: the shapes a worker runs, and the one-line errors for
what cannot run; speculative.sampled_drafts: which workers' chains draw their drafts."""

from __future__ import annotations

from typing import Any

import pytest

from eagletree.config.sections import ShapePolicyName
from eagletree.config.shape_policy import (
    DEFAULT_CANDIDATES,
    ResolvedShapePolicy,
    draws_drafts,
    parse_shape,
    resolve_shape_policy,
)
from eagletree.domain.draft_shape import PLAIN, DraftShape
from eagletree.domain.errors import ConfigurationError

CONFIGURED = DraftShape(5, 4, 8)


def resolve(
    policy: ShapePolicyName,
    candidates: list[str] | None = None,
    worker: str = "eagle_v2",
    tp_size: int = 1,
    shards_dense: bool = False,
) -> ResolvedShapePolicy:
    return resolve_shape_policy(
        policy, candidates, CONFIGURED, worker=worker, tp_size=tp_size, shards_dense=shards_dense
    )


def test_the_shape_grammar_reads_plain_chains_and_trees() -> None:
    assert parse_shape("plain") == PLAIN
    assert parse_shape(" chain:S3 ") == DraftShape.chain(3)
    assert parse_shape("tree:S6,k8,N32") == DraftShape(6, 8, 32)
    for spec, why in [
        ("plain:S1", "plain takes no parameters"),
        ("bush:S1", "unknown kind"),
        ("chain:S2,k2", "a chain takes S only"),
        ("tree:S2,k2", "missing N"),
        ("tree:S2,k2,N2,N3", "N is given twice"),
        ("tree:S2,k2,N9", "exceeds the 6 candidates"),
        ("chain:S0", "S must be at least 1"),
        ("tree:S2,x2,N3", "is not S<n>"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_shape(spec)


def test_fixed_runs_the_configured_shape_and_adaptive_puts_it_first() -> None:
    assert resolve("fixed").shapes == (CONFIGURED,)
    adaptive = resolve("adaptive")
    shapes = adaptive.shapes
    assert shapes[0] == CONFIGURED and PLAIN in shapes
    assert len(shapes) == len(set(shapes)) == len(DEFAULT_CANDIDATES)  # tree:S5,k4,N8 once
    chosen = resolve("adaptive", ["chain:S2", "plain", "chain:S2"])
    assert chosen.shapes == (CONFIGURED, DraftShape.chain(2), PLAIN)


@pytest.mark.parametrize(
    ("policy", "candidates", "where", "message"),
    [
        ("fixed", ["plain"], {}, r"candidate_shapes is set but speculative.policy is fixed"),
        ("adaptive", None, {"worker": "eagle_v1"}, r"runs on the v2 tree worker, not eagle_v1"),
        ("adaptive", None, {"worker": "multi_layer_eagle_v2"}, r"not multi_layer_eagle_v2"),
        ("adaptive", None, {"tp_size": 2}, r"the ranks would have to agree"),
        ("adaptive", None, {"shards_dense": True}, r"the ranks would have to agree"),
        ("adaptive", ["tree:S2,k2,N9"], {}, r"candidate_shapes item 'tree:S2,k2,N9': .*exceeds"),
    ],
)
def test_what_cannot_run_is_a_configuration_error_naming_the_setting(
    policy: ShapePolicyName, candidates: list[str] | None, where: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        resolve(policy, candidates, **where)


@pytest.mark.parametrize(
    ("sampled_drafts", "worker", "draws"),
    [
        ("auto", "eagle_v2", True),
        ("auto", "eagle_v1", True),
        ("drawn", "eagle_v2", True),
        ("top_k", "eagle_v2", False),
        ("top_k", "eagle_v1", False),
        ("auto", "multi_layer_eagle_v2", False),
        ("top_k", "multi_layer_eagle_v2", False),
        ("auto", "none", False),
    ],
)
def test_steps_draw_their_drafts_on_the_eagle_workers_unless_told_top_k(
    sampled_drafts: Any, worker: str, draws: bool
) -> None:
    assert draws_drafts(sampled_drafts, worker) is draws


def test_asking_an_mtp_worker_to_draw_is_a_configuration_error_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r'speculative\.sampled_drafts = "drawn".*"top_k"'):
        draws_drafts("drawn", "multi_layer_eagle_v2")
