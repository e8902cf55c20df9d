"""StepFeedback: what a shape policy learns from each decode step once it is read back — the
time it took and, for a drafting step, its accepted paths.

A step's time is the interval between its read-back and the previous step's
(``ReadBackClock``), so only a step whose predecessor was read back in the same way is timed:
not one that also prefilled (it took longer than its shape's step), nor one inside
``untimed()`` or the first after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

from eagletree.app.engine.worker import ReadRows
from eagletree.app.workers.shapes.step_costs import ReadBackClock
from eagletree.domain.accepted_path import chain_path_ranks

if TYPE_CHECKING:
    from eagletree.app.engine.worker import StepObserver
    from eagletree.app.workers.shapes.policy import ShapePolicy
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.domain.request import Request


class StepFeedback:
    """Numbers the decode steps as they are launched and hands ``policy`` what each one's
    read-back says (nothing where the policy does not observe)."""

    def __init__(self, policy: ShapePolicy, clock: ReadBackClock | None = None) -> None:
        self._policy = policy
        self._clock = ReadBackClock() if clock is None else clock
        self._launched = 0
        self._timing = True  # False inside ``untimed``
        # per chain depth, its path by accepted length (read a few times every step)
        self._chain_paths: dict[int, tuple[tuple[int, ...], ...]] = {}

    def launched(self) -> None:
        """A step (prefill, decode or both) was launched."""
        self._launched += 1

    def observer(
        self, shape: DraftShape, *, timed: bool, paths: bool, catch_up: bool, sampled: bool
    ) -> StepObserver | None:
        """What to call when the decode step just launched, of ``shape``, is read back: it
        learns the step's time where ``timed`` (``catch_up``: a plain step that extended the
        draft over its lag; ``sampled``: some request sampled) and with ``paths`` the
        accepted paths (a tree's in the step's observed columns, a chain's from its emitted
        counts). None where the policy learns nothing."""
        if not self._policy.observes:
            return None
        # a step inside ``untimed`` does not lap the clock: neither it nor the next is timed
        launched = self._launched if self._timing else None
        return partial(self._read_back, shape, launched, timed, paths, catch_up, sampled)

    def _read_back(
        self,
        shape: DraftShape,
        launched: int | None,
        timed: bool,
        paths: bool,
        catch_up: bool,
        sampled: bool,
        requests: Sequence[Request],
        rows: Sequence[Sequence[int]],
    ) -> None:
        seconds = None if launched is None else self._clock.lap(launched)
        if timed and seconds is not None:
            self._policy.observe_time(shape, len(requests), sampled, seconds, catch_up=catch_up)
        if paths:
            self._policy.observe(shape, requests, self._accepted_paths(rows, shape))

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Steps launched inside teach the policy what they accepted, not what they cost: a
        profiler slows a step several times over (the bench profiles a few steps of its first
        window), and an adaptive policy that timed them priced chain S5 at 1.73 ms where it
        takes 1.2 and ran a tree 0.89 x as fast at T 0, bs 64 (H100)."""
        self._timing = False
        try:
            yield
        finally:
            self._timing = True

    def _accepted_paths(
        self, rows: Sequence[Sequence[int]], shape: DraftShape
    ) -> Sequence[Sequence[int]]:
        """Each request's accepted path, its ranks then its offers (``accepted_path_ranks``),
        from its read-back row (num_emitted, num_committed, then the observed columns): a
        tree's are its observed columns; a chain's follow from its accept length
        (``chain_path_ranks``, one row per length made once), so a chain step runs no kernel
        for them. Read where indexed: the policy reads a few rows a step."""
        depth = shape.num_steps
        if shape.topk > 1:
            return ReadRows(rows, lambda row: row[2:])
        by_length = self._chain_paths.get(depth)
        if by_length is None:
            by_length = self._chain_paths[depth] = tuple(
                tuple(chain_path_ranks(accepted, depth)) for accepted in range(depth + 1)
            )
        return ReadRows(rows, lambda row: by_length[row[0] - 1])
