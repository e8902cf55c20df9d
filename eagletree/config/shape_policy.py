"""Configuration: which draft shapes a speculative worker runs — one, or the fastest per step.

``speculative.policy = "fixed"`` drafts (num_steps, eagle_topk, num_draft_tokens) at every
step. ``"adaptive"`` chooses, every step, the candidate that commits the most tokens per second
for the batch (docs/speculative.md, "Adaptive shapes"); the candidates are
``speculative.candidate_shapes`` (``"plain"``, ``"chain:S<n>"``, ``"tree:S<n>,k<n>,N<n>"``),
by default ``DEFAULT_CANDIDATES``, with the configured shape always first. It runs on the v2
tree worker of one process group (a tensor- or dense-sharded group would need its ranks to
agree on every choice; they are refused instead). ``speculative.sampled_drafts`` says how a step
drafts for its sampling requests (``draws_drafts``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eagletree.config.sections import SampledDraftsName, ShapePolicyName
from eagletree.domain.draft_shape import PLAIN, DraftShape
from eagletree.domain.errors import ConfigurationError

# plain decoding; chains of 1 / 2 / 3 / 5 / 7 (the shallow ones for sampling at large batches,
# where a drafted token is accepted about half the time and chain S3 barely pays for its step:
# on the H100 chain S1 and S2 step at 0.71–0.78 and 0.88–0.91 × chain S3); trees of width 4 over
# 8 / 16 / 32 nodes (the last 8 deep: the real pair's fastest shape at bs 1, greedy, 1.2 × chain
# S5, where width 8 over 32 nodes, never a cell's fastest, gained 1.1 ×) and width 8 over 64 nodes
DEFAULT_CANDIDATES = (
    "plain",
    "chain:S1",
    "chain:S2",
    "chain:S3",
    "chain:S5",
    "chain:S7",
    "tree:S5,k4,N8",
    "tree:S5,k4,N16",
    "tree:S8,k4,N32",
    "tree:S8,k8,N64",
)
SHAPE_EXAMPLES = "plain, chain:S3, tree:S5,k4,N8"
_FIELD = re.compile(r"([SkN])(\d+)")


def parse_shape(spec: str) -> DraftShape:
    """``plain``, ``chain:S<n>`` or ``tree:S<n>,k<n>,N<n>``; ValueError says why not."""
    text = spec.strip()
    kind, _, rest = text.partition(":")
    if kind == "plain":
        if rest:
            raise ValueError("plain takes no parameters")
        return PLAIN
    if kind not in ("chain", "tree"):
        raise ValueError(f"unknown kind {kind!r}")
    fields: dict[str, int] = {}
    for item in rest.split(","):
        match = _FIELD.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()!r} is not S<n>, k<n> or N<n>")
        name, value = match.group(1), int(match.group(2))
        if name in fields:
            raise ValueError(f"{name} is given twice")
        if value < 1:
            raise ValueError(f"{name} must be at least 1")
        fields[name] = value
    if kind == "chain":
        if set(fields) != {"S"}:
            raise ValueError("a chain takes S only (k is 1 and N is S + 1)")
        return DraftShape.chain(fields["S"])
    if set(fields) != {"S", "k", "N"}:
        missing = ", ".join(name for name in "SkN" if name not in fields)
        raise ValueError(f"a tree needs S, k and N; missing {missing}")
    return DraftShape(fields["S"], fields["k"], fields["N"])


def shape_spec(shape: DraftShape) -> str:
    """The spec ``parse_shape`` reads back as ``shape``: plain, chain:S3, tree:S5,k4,N8."""
    s, k, n = shape.num_steps, shape.topk, shape.num_draft_tokens
    if shape.is_plain:
        return "plain"
    return f"chain:S{s}" if k == 1 else f"tree:S{s},k{k},N{n}"


@dataclass(frozen=True, slots=True)
class ResolvedShapePolicy:
    """The policy and the shapes it chooses among, the configured shape first."""

    policy: ShapePolicyName
    shapes: tuple[DraftShape, ...]


def resolve_shape_policy(
    policy: ShapePolicyName,
    candidates: list[str] | None,
    configured: DraftShape,
    *,
    worker: str,
    tp_size: int,
    shards_dense: bool,
) -> ResolvedShapePolicy:
    """The shapes a worker of ``worker`` runs; ConfigurationError names what to change."""
    if policy == "fixed":
        if candidates is not None:
            raise ConfigurationError(
                "speculative.candidate_shapes is set but speculative.policy is fixed: set "
                'speculative.policy = "adaptive" or remove candidate_shapes'
            )
        return ResolvedShapePolicy("fixed", (configured,))
    if worker != "eagle_v2":
        raise ConfigurationError(
            f'speculative.policy = "adaptive" runs on the v2 tree worker, not {worker}: use '
            'algorithm eagle or eagle3 with version v2, or speculative.policy = "fixed"'
        )
    if tp_size > 1 or shards_dense:
        raise ConfigurationError(
            'speculative.policy = "adaptive" with parallel.tp_size > 1 or '
            "parallel.shard_dense_over_dp: the ranks would have to agree on every step's shape; "
            'use speculative.policy = "fixed"'
        )
    shapes = [configured]
    for spec in DEFAULT_CANDIDATES if candidates is None else candidates:
        try:
            shape = parse_shape(spec)
        except ValueError as error:
            raise ConfigurationError(
                f"speculative.candidate_shapes item {spec!r}: {error} (examples: {SHAPE_EXAMPLES})"
            ) from None
        if shape not in shapes:
            shapes.append(shape)
    return ResolvedShapePolicy("adaptive", tuple(shapes))


# the workers whose steps can draw their drafts: the tree workers (EAGLE, EAGLE-3, one MTP
# layer); the multi-layer MTP worker drafts its chain inside the extend, as argmax
DRAWING_WORKERS = ("eagle_v1", "eagle_v2")


def draws_drafts(sampled_drafts: SampledDraftsName, worker: str) -> bool:
    """Whether a drafting step of ``worker`` draws its sampling requests' drafts;
    ConfigurationError where ``drawn`` is asked of a worker that cannot."""
    if sampled_drafts == "top_k" or worker == "none":
        return False
    if worker in DRAWING_WORKERS:
        return True
    if sampled_drafts == "drawn":
        raise ConfigurationError(
            f'speculative.sampled_drafts = "drawn": the {worker} worker drafts the argmax '
            'only; set speculative.sampled_drafts = "auto" or "top_k"'
        )
    return False
