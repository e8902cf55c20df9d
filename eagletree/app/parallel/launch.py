"""Application: the ``--tp N`` / ``--dp M`` flags of `generate`, `serve` and `bench`, the
settings they set, and the launch of a command's ranks (spawned here, or torchrun's).

Importing this module is cheap (argparse only): the ``eagletree`` parser adds the flags
without pulling in torch, which the launch imports when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagletree.config.settings import EngineSettings

TP_HELP = (
    "tensor-parallel ranks (parallel.tp_size): spawns N processes, one per device "
    "(under torchrun: the ranks it launched)"
)


def add_parallel_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    dp_help: str,
    tp_help_end: str = "",
    default: int | None = None,
) -> None:
    """Add ``--tp N`` and ``--dp M`` (both ``default``, None: the settings' sizes) to
    ``parser``. ``dp_help`` says what a data-parallel rank is to the command; the help of
    ``--tp`` ends with ``tp_help_end``, and that of ``--dp`` with the processes it spawns."""
    parser.add_argument("--tp", type=int, default=default, metavar="N", help=TP_HELP + tp_help_end)
    parser.add_argument(
        "--dp",
        type=int,
        default=default,
        metavar="M",
        help=f"data-parallel {dp_help}; with --tp N spawns N·M processes",
    )


def with_parallel(
    settings: EngineSettings, tp_size: int | None, dp_size: int | None = None
) -> EngineSettings:
    """``settings`` with ``parallel.tp_size`` = ``tp_size`` (``--tp``) and ``parallel.dp_size``
    = ``dp_size`` (``--dp``), each unchanged for None; ValueError naming the flag of a size
    below 1."""
    update: dict[str, int] = {}
    for flag, name, size in (("--tp", "tp_size", tp_size), ("--dp", "dp_size", dp_size)):
        if size is None:
            continue
        if size < 1:
            raise ValueError(f"{flag} must be >= 1, got {size}")
        update[name] = size
    if not update:
        return settings
    parallel = settings.parallel.model_copy(update=update)
    return settings.model_copy(update={"parallel": parallel})


def launch_ranks(
    command: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    world_size: int,
    this_rank: Callable[[], int],
    note: Callable[[str], None],
    *,
    stop_rank_0_on_signal: bool = False,
) -> int:
    """Run a command as ``world_size`` ranks from a process in no group: launched by torchrun,
    this process is one of them and runs ``this_rank()`` inside torchrun's group (then leaves
    it); otherwise it spawns them, each running ``command(args)`` inside the group it joined,
    and waits (``stop_rank_0_on_signal``: see ``spawned_group.spawn_ranks``). Returns the exit
    status; a failed rank is ``note``d as an error, status 1."""
    from eagletree.app.parallel import process_group, spawned_group

    if process_group.launched_by_torchrun():
        return process_group.run_in_launched_group(this_rank)
    try:
        spawned_group.spawn_ranks(
            _command_rank,
            world_size,
            (command, args),
            timeout_s=None,
            stop_rank_0_on_signal=stop_rank_0_on_signal,
        )
    except spawned_group.RankFailed as failure:
        note(f"error: {failure}")
        return 1
    return 0


def _command_rank(rank: int, command: Callable[[argparse.Namespace], Any], args: Any) -> None:
    """One spawned rank: the same command, inside the group."""
    status = command(args)
    if status:
        raise SystemExit(status)
