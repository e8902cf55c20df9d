"""The --tp / --dp flags that generate, serve and bench share: what they set in the settings,
what a bad value says, and how a failed spawned rank reaches the command's exit status."""

from __future__ import annotations

import argparse

import pytest

from eagletree.app.parallel import process_group, spawned_group
from eagletree.app.parallel.launch import add_parallel_flags, launch_ranks, with_parallel
from eagletree.config.settings import EngineSettings


def parse(argv: list[str], default: int | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parallel_flags(parser, dp_help="replicas", default=default)
    return parser.parse_args(argv)


def test_flags_left_out_keep_the_settings_sizes() -> None:
    settings = EngineSettings(parallel={"tp_size": 2, "dp_size": 3})
    args = parse([])
    assert (args.tp, args.dp) == (None, None)
    parallel = with_parallel(settings, args.tp, args.dp).parallel
    assert (parallel.tp_size, parallel.dp_size) == (2, 3)


def test_given_flags_set_the_sizes_and_nothing_else() -> None:
    settings = EngineSettings(parallel={"tp_size": 2, "dp_size": 3}, memory={"page_size": 16})
    args = parse(["--tp", "4", "--dp", "1"])
    changed = with_parallel(settings, args.tp, args.dp)
    assert (changed.parallel.tp_size, changed.parallel.dp_size) == (4, 1)
    assert changed.memory == settings.memory
    assert (settings.parallel.tp_size, settings.parallel.dp_size) == (2, 3)  # a copy


@pytest.mark.parametrize(
    ("argv", "message"), [(["--tp", "0"], "--tp must be >= 1, got 0"), (["--dp", "-2"], "--dp")]
)
def test_a_size_below_one_is_refused_naming_its_flag(argv: list[str], message: str) -> None:
    args = parse(argv)
    with pytest.raises(ValueError, match=message):
        with_parallel(EngineSettings(), args.tp, args.dp)


def test_a_default_is_what_a_left_out_flag_parses_to() -> None:
    args = parse(["--dp", "2"], default=1)
    assert (args.tp, args.dp) == (1, 2)


def test_spawned_ranks_run_the_command_and_a_failed_one_exits_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = argparse.Namespace(tp=2, dp=2)
    spawned: list[tuple[int, tuple[object, ...]]] = []

    def spawn(main: object, world_size: int, main_args: tuple[object, ...], **_: object) -> None:
        spawned.append((world_size, main_args))
        raise spawned_group.RankFailed(2, world_size, "Traceback: boom")

    def command(_: argparse.Namespace) -> int:
        return 0

    monkeypatch.setattr(process_group, "launched_by_torchrun", lambda: False)
    monkeypatch.setattr(spawned_group, "spawn_ranks", spawn)
    notes: list[str] = []
    assert launch_ranks(command, args, 4, lambda: 0, notes.append) == 1
    assert spawned == [(4, (command, args))]
    assert notes == ["error: rank 2 of 4 failed first:\nTraceback: boom"]
