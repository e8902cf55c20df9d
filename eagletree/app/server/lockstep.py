"""App: the tensor-parallel server's lockstep — rank 0 hands each step's commands to the others.

Every rank of a tensor-parallel group must run the same engine steps over the same requests
in the same order (the scheduler is deterministic, so no plan is broadcast). Only rank 0 has
HTTP clients: before each step its engine loop broadcasts the step's new submissions and aborts
as one small picklable list, over a gloo group of its own so that the broadcast never waits
on the GPU; every follower applies that list to its engine and steps when it has work. Rank 0
broadcasts even an empty list at least every ``IDLE_WAIT_S`` of the loop (a heartbeat, well
inside the collective timeout), and ``STOP`` when the server shuts down.

Data-parallel, the same broadcast reaches every rank of every replica: a submission or abort
names the replica it is for, and ``STEP`` tells all ranks to step (``replica_loop``).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import torch.distributed as dist

from eagletree.app.engine.loop import Engine
from eagletree.app.parallel.process_group import COLLECTIVE_TIMEOUT
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class SubmitCommand:
    """A request rank 0 accepted from a client (its seed already fixed when it samples)."""

    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class AbortCommand:
    request_id: int


@dataclass(frozen=True, slots=True)
class PlacedSubmit:
    """Data-parallel: a request rank 0 accepted and placed on replica ``replica``; ``key`` names
    it between rank 0 and that replica (each replica's engine numbers its requests itself)."""

    key: int
    replica: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class PlacedAbort:
    """Data-parallel: abort the request ``key``, which runs on replica ``replica``."""

    key: int
    replica: int


STOP: Final = "stop"
# data-parallel: every rank steps after applying the list (idle where its replica has nothing)
STEP: Final = "step"

StepCommand = SubmitCommand | AbortCommand | PlacedSubmit | PlacedAbort | str


class CommandBroadcast:
    """One gloo broadcast per step from ``source`` (rank 0) to the rest of the default group
    (tensor-parallel: the replica's ranks; data-parallel: every rank of every replica).

    Building it is a collective (``new_group``): every rank must build it, in the same order
    relative to the other groups it creates.
    """

    def __init__(self, source: int = 0, timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> None:
        self._source = source
        # host objects only: gloo, also beside an NCCL default group
        self._group = dist.new_group(backend="gloo", timeout=timeout)

    def share(self, commands: Sequence[StepCommand]) -> None:
        """Rank 0: send this step's commands (returns once every follower has them)."""
        dist.broadcast_object_list([list(commands)], src=self._source, group=self._group)

    def receive(self) -> list[StepCommand]:
        """A follower: the commands of rank 0's next step."""
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=self._source, group=self._group)
        commands = box[0]
        assert isinstance(commands, list)
        return commands

    def follow(self, engine: Engine) -> None:
        """A follower's loop: apply rank 0's commands, step as it steps, until ``STOP``."""
        follow(engine, self.receive)


def follow(
    engine: Engine,
    receive: Callable[[], list[StepCommand]],
    on_submit: Callable[[Request], None] | None = None,
) -> None:
    """Apply each list ``receive`` returns to ``engine`` and step when it has work, until
    ``STOP``; then close the engine. ``on_submit`` sees every request it accepts."""
    with engine:
        while True:
            commands = receive()
            if STOP in commands:
                return
            for command in commands:
                request = apply_quietly(engine, command)
                if request is not None and on_submit is not None:
                    on_submit(request)
            if engine.has_work():
                engine.step()


def apply_quietly(engine: Engine, command: StepCommand) -> Request | None:
    """Apply a command as rank 0 did (the request a submission made); a submission it rejected
    is rejected here the same way (the engine's checks are deterministic), and only rank 0
    tells the client."""
    if isinstance(command, SubmitCommand):
        with contextlib.suppress(ValueError):
            return engine.submit(command.prompt_ids, command.params)
    elif isinstance(command, AbortCommand):
        engine.abort(command.request_id)
    return None
