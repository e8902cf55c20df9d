"""Application: the decode configurations `eagletree bench` compares, parsed from short specs.

``plain`` decodes one token per step; ``chain:S3`` drafts a chain of S tokens (k 1, N S + 1);
``tree:S5,k4,N8`` drafts S steps of beam width k and verifies the N best nodes (root included).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from eagletree.config.eagle_hook import max_draft_tokens
from eagletree.domain.errors import ConfigurationError

_FIELD = re.compile(r"([SkN])(\d+)")
_EXAMPLES = "plain, chain:S3, tree:S5,k4,N8"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One decode configuration; ``num_steps`` 0 is plain (non-speculative) decoding."""

    kind: str  # "plain", "chain" or "tree"
    num_steps: int = 0
    topk: int = 1
    num_draft_tokens: int = 1

    @property
    def speculative(self) -> bool:
        return self.kind != "plain"

    @property
    def name(self) -> str:
        if not self.speculative:
            return "plain"
        return f"{self.kind} S{self.num_steps} k{self.topk} N{self.num_draft_tokens}"

    @property
    def max_tokens_per_step(self) -> int:
        """Most tokens one step can emit per request: every draft step accepted plus the bonus."""
        return self.num_steps + 1


PLAIN = BenchConfig("plain")


def parse_config(spec: str) -> BenchConfig:
    """``plain``, ``chain:S<n>`` or ``tree:S<n>,k<n>,N<n>``; ConfigurationError says why not."""
    text = spec.strip()
    kind, _, rest = text.partition(":")
    if kind == "plain":
        if rest:
            raise _bad(spec, "plain takes no parameters")
        return PLAIN
    if kind not in ("chain", "tree"):
        raise _bad(spec, f"unknown kind {kind!r}")
    fields: dict[str, int] = {}
    for item in rest.split(","):
        match = _FIELD.fullmatch(item.strip())
        if match is None:
            raise _bad(spec, f"{item.strip()!r} is not S<n>, k<n> or N<n>")
        name, value = match.group(1), int(match.group(2))
        if name in fields:
            raise _bad(spec, f"{name} is given twice")
        if value < 1:
            raise _bad(spec, f"{name} must be at least 1")
        fields[name] = value
    if kind == "chain":
        if set(fields) != {"S"}:
            raise _bad(spec, "a chain takes S only (k is 1 and N is S + 1)")
        steps = fields["S"]
        return BenchConfig("chain", steps, 1, steps + 1)
    if set(fields) != {"S", "k", "N"}:
        missing = ", ".join(name for name in "SkN" if name not in fields)
        raise _bad(spec, f"a tree needs S, k and N; missing {missing}")
    steps, topk, tokens = fields["S"], fields["k"], fields["N"]
    limit = max_draft_tokens(steps, topk)
    if not 2 <= tokens <= limit:
        raise _bad(spec, f"N must be in 2..{limit} for S{steps} k{topk} (root + k + (S-1)·k²)")
    return BenchConfig("tree", steps, topk, tokens)


def parse_configs(specs: Sequence[str]) -> list[BenchConfig]:
    """The configurations in order, duplicates dropped, plain first whenever one speculates
    (its step time is the denominator of every break-even acceptance length)."""
    configs: list[BenchConfig] = []
    for spec in specs:
        config = parse_config(spec)
        if config not in configs:
            configs.append(config)
    if not configs:
        raise ConfigurationError("--configs is empty: give at least one of " + _EXAMPLES)
    if any(c.speculative for c in configs):
        configs = [PLAIN, *(c for c in configs if c != PLAIN)]
    return configs


def _bad(spec: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"bad --configs item {spec!r}: {why} (examples: {_EXAMPLES})")
