"""Application: the decode configurations `eagletree bench` compares, parsed from short specs.

``plain`` decodes one token per step; ``chain:S3`` drafts a chain of S tokens (k 1, N S + 1);
``tree:S5,k4,N8`` drafts S steps of beam width k and verifies the N best nodes (root included)
— the grammar of ``speculative.candidate_shapes``. ``adaptive`` (``--policy adaptive``) lets the
v2 worker choose among the run's fixed configurations every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eagletree.config.shape_policy import SHAPE_EXAMPLES, parse_shape
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.errors import ConfigurationError

ADAPTIVE_NAME = "adaptive"  # the adaptive configuration's name in the rows and tables


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One decode configuration: a fixed ``shape`` (plain: S = 0), or the adaptive policy over
    ``candidates`` (its ``shape`` the default, the first of them that speculates)."""

    shape: DraftShape
    candidates: tuple[DraftShape, ...] = ()

    @property
    def adaptive(self) -> bool:
        return bool(self.candidates)

    @property
    def speculative(self) -> bool:
        return self.adaptive or not self.shape.is_plain

    @property
    def name(self) -> str:
        return ADAPTIVE_NAME if self.adaptive else self.shape.label

    @property
    def max_tokens_per_step(self) -> int:
        """Most tokens one step can emit per request: every draft step accepted plus the bonus."""
        return 1 + max(s.num_steps for s in (self.shape, *self.candidates))


PLAIN = BenchConfig(DraftShape(0, 1, 1))


def parse_config(spec: str) -> BenchConfig:
    """``plain``, ``chain:S<n>`` or ``tree:S<n>,k<n>,N<n>``; ConfigurationError says why not."""
    try:
        return BenchConfig(parse_shape(spec))
    except ValueError as error:
        raise ConfigurationError(
            f"bad --configs item {spec!r}: {error} (examples: {SHAPE_EXAMPLES})"
        ) from None


def parse_configs(specs: Sequence[str], adaptive: bool = False) -> list[BenchConfig]:
    """The configurations in order, duplicates dropped, plain first whenever one speculates
    (its step time is the denominator of every break-even acceptance length); with
    ``adaptive``, last the adaptive policy over all of them."""
    configs: list[BenchConfig] = []
    for spec in specs:
        config = parse_config(spec)
        if config not in configs:
            configs.append(config)
    if not configs:
        raise ConfigurationError("--configs is empty: give at least one of " + SHAPE_EXAMPLES)
    if any(c.speculative for c in configs) or adaptive:
        configs = [PLAIN, *(c for c in configs if c != PLAIN)]
    if adaptive:
        speculative = [c.shape for c in configs if c.speculative]
        if not speculative:
            raise ConfigurationError("--policy adaptive needs a speculative config among --configs")
        shapes = tuple(c.shape for c in configs)
        configs.append(BenchConfig(speculative[0], shapes))
    return configs
