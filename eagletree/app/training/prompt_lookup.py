"""App: the model-free baseline a draft head must beat — prompt-lookup (n-gram) drafting.

A prompt-lookup drafter (vLLM's ``ngram`` speculator, "prompt lookup decoding") proposes, for a
context ending in the n-gram g, the tokens that followed the latest earlier occurrence of g in
the context, trying n from ``max_ngram`` down to ``min_ngram``. It needs no model, so under
greedy decoding its acceptance is a function of the target's greedy continuation alone: a
verify step from context ``c`` accepts the longest prefix of the proposal that equals the
continuation and emits that plus the target's own next token. ``simulate`` replays exactly
that, so the figures are what an engine running the drafter would count (the prefill's first
token is not a verify step, as in ``Engine.stats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Drafter(Protocol):
    """Proposes draft tokens for a context (the tokens so far, prompt included)."""

    def propose(self, context: Sequence[int]) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class LookupDrafter:
    """Proposes up to ``num_draft`` tokens by n-gram lookup (``min_ngram`` ≤ n ≤ ``max_ngram``)."""

    num_draft: int
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.num_draft < 1 or not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need num_draft >= 1 and 1 <= min_ngram <= max_ngram, got {self.num_draft}, "
                f"{self.min_ngram}, {self.max_ngram}"
            )

    def propose(self, context: Sequence[int]) -> list[int]:
        """The continuation of the latest earlier match of the longest suffix n-gram found."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = list(context[-n:])
            # latest start i < len − n whose n tokens equal the suffix (not the suffix itself)
            for start in range(len(context) - n - 1, -1, -1):
                if list(context[start : start + n]) == suffix:
                    follow = start + n
                    return list(context[follow : follow + self.num_draft])
        return []


def simulate(drafter: Drafter, prompt: Sequence[int], continuation: Sequence[int]) -> list[int]:
    """Tokens emitted per verify step when ``drafter`` drafts for a target whose greedy output
    after ``prompt`` is ``continuation`` (its first token comes from the prefill)."""
    emitted_per_step: list[int] = []
    done = min(1, len(continuation))
    while done < len(continuation):
        proposal = drafter.propose([*prompt, *continuation[:done]])
        accepted = 0
        for drafted, actual in zip(proposal, continuation[done:], strict=False):
            if drafted != actual:
                break
            accepted += 1
        emitted = min(accepted + 1, len(continuation) - done)
        emitted_per_step.append(emitted)
        done += emitted
    return emitted_per_step
