"""`eagletree serve`: build the engine, start its loop, serve HTTP with uvicorn until stopped.

``--tp N`` serves one engine tensor-parallel over N ranks, ``--dp M`` M data-parallel
replicas (with both, M replicas of N ranks): launched by torchrun, this process is one of the
N·M ranks; otherwise it spawns them and waits, forwarding SIGINT / SIGTERM to rank 0. Rank 0
serves HTTP and hands every step's commands to the others (``lockstep``); data-parallel, it
places each request on a replica and the replicas report its tokens back (``replica_loop``).
It stops the others with its last broadcast, and the group ends through the final barrier:
spawned or torchrun's, every rank destroys its groups only once all are done.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.config.settings import EngineSettings


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT / SIGTERM); 1 with a message for bad settings."""
    try:
        import uvicorn  # noqa: F401  (checked first: _serve imports them again)

        from eagletree.app.server.openai_api import create_app  # noqa: F401
    except ImportError as error:
        print(
            f"error: eagletree serve needs the serve extra (pip install 'eagletree[serve]'): "
            f"{error}",
            file=sys.stderr,
        )
        return 1
    from eagletree.app.composition.run_settings import prepare_settings
    from eagletree.app.parallel import process_group  # imported here: it pulls in torch
    from eagletree.app.parallel.launch import launch_ranks, with_parallel

    if not 0 <= args.port <= 65535:
        _note(f"error: --port {args.port} is not a TCP port (0 to 65535)")
        return 1
    if args.max_tokens_limit < 1:  # it bounds every request's output, the defaults too
        _note(
            f"error: --max-tokens-limit {args.max_tokens_limit}: must be at least 1 (the most "
            "tokens one request may generate)"
        )
        return 1
    try:
        settings = with_parallel(prepare_settings(args.settings, _note), args.tp, args.dp)
    except (ConfigurationError, ValueError) as error:
        _note(f"error: {error}")
        return 1
    world_size = settings.parallel.tp_size * settings.parallel.dp_size
    if world_size == 1 or process_group.in_process_group():  # one process, or a spawned rank
        return _serve(args, settings)
    # the ranks leave together once every one is done (rank 0: its loop stopped), so no gloo
    # group outlives its rank's work nor is torn down under a peer still using it
    return launch_ranks(
        run, args, world_size, lambda: _serve(args, settings), _note, stop_rank_0_on_signal=True
    )


def _serve(args: argparse.Namespace, settings: EngineSettings) -> int:
    """This process's part once it is in its group (if any): rank 0 serves, the others step."""
    import uvicorn

    from eagletree.app.composition.container import build_data_parallel_engine, build_engine
    from eagletree.app.parallel import process_group
    from eagletree.app.server.engine_loop import EngineLoop
    from eagletree.app.server.lockstep import CommandBroadcast
    from eagletree.app.server.openai_api import create_app
    from eagletree.app.server.replica_loop import (
        DataParallelLoop,
        Replica,
        follow_replica,
        report_gather,
    )

    tp_size, dp_size = settings.parallel.tp_size, settings.parallel.dp_size
    world_size = tp_size * dp_size
    try:
        # every rank makes its groups in the same order: the broadcast's, then the engine's
        broadcast = CommandBroadcast() if world_size > 1 else None
        if dp_size > 1:
            group = build_data_parallel_engine(settings)
            engine, groups = group.engine, group.groups
        else:
            engine, groups = build_engine(settings), None
    except (ConfigurationError, ValueError) as error:
        _note(f"error: {error}")
        return 1
    rank = process_group.group_rank()
    replica = None
    gather = None
    if groups is not None:  # data-parallel: this rank's replica, and how it reports to rank 0
        replica = Replica(engine, groups.dp_rank, watch=groups.tp_rank == 0)
        gather = report_gather(groups.dp_group, dp_size) if groups.tp_rank == 0 else None
    if broadcast is not None and rank != 0:
        # rank 0 stops the group (a terminal's Ctrl-C reaches every rank of it)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _note(f"rank {rank} of {world_size}: pid {os.getpid()}, stepping with rank 0")
        if replica is None:
            broadcast.follow(engine)
        else:
            follow_replica(replica, broadcast.receive, gather)
        return 0
    assert settings.model.target_path is not None
    name = args.served_model_name or _model_name(settings.model.target_path)
    api_key = args.api_key or os.environ.get("EAGLETREE_API_KEY") or None

    def end_serving(_: BaseException) -> None:  # a rank of the group is gone: so is the server
        server.should_exit = True

    on_failure = None if broadcast is None else end_serving
    loop: EngineLoop
    if replica is None:
        share = None if broadcast is None else broadcast.share
        loop = EngineLoop(engine, share=share, on_failure=on_failure)
    else:
        assert broadcast is not None and gather is not None
        loop = DataParallelLoop(
            replica, dp_size, share=broadcast.share, gather=gather, on_failure=on_failure
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
        _note(f"rank 0 of {world_size}: pid {os.getpid()}, serving HTTP")
    loop.start()
    parallel = [f"tensor-parallel over {tp_size} ranks"] if tp_size > 1 else []
    parallel += [f"{dp_size} data-parallel replicas"] if dp_size > 1 else []
    _note(
        f"serving {name!r} on http://{args.host}:{args.port}/v1 "
        f"({', '.join([settings.model.device, settings.model.dtype, *parallel])}; API key "
        f"{'required' if api_key else 'not required'})"
    )
    try:
        server.run()
    finally:
        loop.stop()
    if loop.failure is not None:
        _note(f"error: the engine loop failed: {loop.failure!r}")
        return 1
    if loop.alive:  # still in a step or a collective: the group cannot be left together
        _note("error: the engine loop did not stop")
        return 1
    return 0


def _note(message: str) -> None:
    print(message, file=sys.stderr)


def _stopping(_number: int, _frame: object) -> None:
    """The handler left after uvicorn's: the server is already shutting down."""


def _model_name(target_path: str) -> str:
    from eagletree.app.composition.default_checkpoint import default_checkpoint_dir

    path = Path(target_path)
    if path == default_checkpoint_dir() / "target":
        return "eagletree-default"
    return path.name if path.name != "target" else path.parent.name
