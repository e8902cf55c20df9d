"""`eagletree serve`: build the engine, start its loop, serve HTTP with uvicorn until stopped.

``--tp N`` serves one engine tensor-parallel over N ranks: launched by torchrun, this process
is one of them; otherwise it spawns them and waits, forwarding SIGINT / SIGTERM to rank 0.
Rank 0 serves HTTP and hands every step's commands to the others (``lockstep``); it stops
them with its last broadcast, and the group ends through the final barrier.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from eagletree.domain.errors import ConfigurationError


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT / SIGTERM); 1 with a message for bad settings."""
    try:
        import uvicorn

        from eagletree.app.server.openai_api import create_app
    except ImportError as error:
        print(
            f"error: eagletree serve needs the serve extra (pip install 'eagletree[serve]'): "
            f"{error}",
            file=sys.stderr,
        )
        return 1
    from eagletree.app import distributed
    from eagletree.app.engine import Engine
    from eagletree.app.generate_cli import prepare_settings, with_parallel
    from eagletree.app.server.engine_loop import EngineLoop
    from eagletree.app.server.lockstep import CommandBroadcast

    def note(message: str) -> None:
        print(message, file=sys.stderr)

    if not 0 <= args.port <= 65535:
        note(f"error: --port {args.port} is not a TCP port (0 to 65535)")
        return 1
    try:
        settings = with_parallel(prepare_settings(args.settings, note), args.tp)
        _refuse_data_parallel(args.dp, settings.parallel.dp_size)
        tp_size = settings.parallel.tp_size
        if tp_size > 1 and not distributed.in_process_group():
            if not distributed.launched_by_torchrun():
                return _spawn_ranks(args, tp_size, note)
            distributed.join_launched_group()
        broadcast = CommandBroadcast() if tp_size > 1 else None
        engine = Engine.from_settings(settings)
    except (ConfigurationError, ValueError) as error:
        note(f"error: {error}")
        return 1
    rank = distributed.group_rank()
    if broadcast is not None and rank != 0:
        # rank 0 stops the group (a terminal's Ctrl-C reaches every rank of it)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        note(f"rank {rank} of {tp_size}: pid {os.getpid()}, stepping with rank 0")
        broadcast.follow(engine)
        return 0
    assert settings.model.target_path is not None
    name = args.served_model_name or _model_name(settings.model.target_path)
    api_key = args.api_key or os.environ.get("EAGLETREE_API_KEY") or None

    def end_serving(_: BaseException) -> None:  # a rank of the group is gone: so is the server
        server.should_exit = True

    loop = EngineLoop(
        engine,
        share=None if broadcast is None else broadcast.share,
        on_failure=None if broadcast is None else end_serving,
    )
    app = create_app(loop, name, api_key=api_key, max_tokens_limit=args.max_tokens_limit)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it: the loop must still stop (and, tensor-
    # parallel, rank 0 must live on to stop the other ranks)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _stopping)
    if broadcast is not None:
        note(f"rank 0 of {tp_size}: pid {os.getpid()}, serving HTTP")
    loop.start()
    note(
        f"serving {name!r} on http://{args.host}:{args.port}/v1 "
        f"({settings.model.device}, {settings.model.dtype}"
        f"{f', tensor-parallel over {tp_size} ranks' if tp_size > 1 else ''}; API key "
        f"{'required' if api_key else 'not required'})"
    )
    try:
        server.run()
    finally:
        loop.stop()
    if loop.failure is not None:
        note(f"error: the engine loop failed: {loop.failure!r}")
        return 1
    return 0


def _refuse_data_parallel(flag: int | None, dp_size: int) -> None:
    size = dp_size if flag is None else flag
    if size != 1:
        raise ValueError(
            f"eagletree serve runs one engine replica (data parallelism {size} asked): it has no "
            "router that spreads HTTP requests over data-parallel replicas yet; drop --dp (and "
            "parallel.dp_size), or run one server per replica"
        )


def _stopping(_number: int, _frame: object) -> None:
    """The handler left after uvicorn's: the server is already shutting down."""


def _spawn_ranks(args: argparse.Namespace, tp_size: int, note: Callable[[str], None]) -> int:
    from eagletree.app import distributed

    try:
        distributed.spawn_ranks(
            _serve_rank, tp_size, (args,), timeout_s=None, stop_rank_0_on_signal=True
        )
    except distributed.RankFailed as failure:
        note(f"error: {failure}")
        return 1
    return 0


def _serve_rank(rank: int, args: argparse.Namespace) -> None:
    """One spawned rank: the same command inside the group."""
    status = run(args)
    if status:
        raise SystemExit(status)


def _model_name(target_path: str) -> str:
    from eagletree.app.default_checkpoint import default_checkpoint_dir

    path = Path(target_path)
    if path == default_checkpoint_dir() / "target":
        return "eagletree-default"
    return path.name if path.name != "target" else path.parent.name
