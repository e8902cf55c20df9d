"""Which draft shape a speculative step runs: the protocol every policy meets, and the
policy of one fixed shape (``adaptive.AdaptiveShapes`` chooses the fastest for each
batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from eagletree.domain.draft_shape import DraftShape
    from eagletree.domain.request import Request


class ShapePolicy(Protocol):
    """Chooses each decode step's draft shape among ``shapes`` (the first: the default, run by
    idle steps) and learns from what steps accepted when ``observes``. (The steps each shape
    ran are the worker's count, ``SpeculativeWorker.shape_steps``.)"""

    @property
    def shapes(self) -> tuple[DraftShape, ...]: ...

    @property
    def observes(self) -> bool: ...

    def choose(self, decode: Sequence[Request]) -> DraftShape: ...

    def observe(
        self, shape: DraftShape, requests: Sequence[Request], paths: Sequence[Sequence[int]]
    ) -> None:
        """A read-back step of ``shape`` (drafting): per request, its accepted path's ranks
        then offers (``accepted_path_ranks``, S columns each)."""

    def observe_time(
        self,
        shape: DraftShape,
        batch_size: int,
        sampled: bool,
        seconds: float,
        *,
        catch_up: bool = False,
    ) -> None:
        """A decode step of ``shape`` (plain included) over ``batch_size`` requests, some
        sampling or none, took ``seconds`` (``ReadBackClock``); ``catch_up``: a plain step that
        also extended the draft over its lag."""


class FixedShape:
    """Every step drafts ``shape``."""

    observes = False

    def __init__(self, shape: DraftShape) -> None:
        self.shapes = (shape,)

    def choose(self, decode: Sequence[Request]) -> DraftShape:
        return self.shapes[0]

    def observe(
        self, shape: DraftShape, requests: Sequence[Request], paths: Sequence[Sequence[int]]
    ) -> None:
        return None

    def observe_time(
        self,
        shape: DraftShape,
        batch_size: int,
        sampled: bool,
        seconds: float,
        *,
        catch_up: bool = False,
    ) -> None:
        return None
