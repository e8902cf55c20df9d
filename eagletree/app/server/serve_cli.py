"""`eagletree serve`: build the engine, start its loop, serve HTTP with uvicorn until stopped."""

from __future__ import annotations

import argparse
import os
import sys
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
    from eagletree.app.engine import Engine
    from eagletree.app.generate_cli import prepare_settings
    from eagletree.app.server.engine_loop import EngineLoop

    def note(message: str) -> None:
        print(message, file=sys.stderr)

    if not 0 <= args.port <= 65535:
        note(f"error: --port {args.port} is not a TCP port (0 to 65535)")
        return 1
    try:
        settings = prepare_settings(args.settings, note)
        engine = Engine.from_settings(settings)
    except ConfigurationError as error:
        note(f"error: {error}")
        return 1
    assert settings.model.target_path is not None
    name = args.served_model_name or _model_name(settings.model.target_path)
    api_key = args.api_key or os.environ.get("EAGLETREE_API_KEY") or None
    loop = EngineLoop(engine)
    loop.start()
    app = create_app(loop, name, api_key=api_key, max_tokens_limit=args.max_tokens_limit)
    note(
        f"serving {name!r} on http://{args.host}:{args.port}/v1 "
        f"({settings.model.device}, {settings.model.dtype}; API key "
        f"{'required' if api_key else 'not required'})"
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        loop.stop()
    return 0


def _model_name(target_path: str) -> str:
    from eagletree.app.default_checkpoint import default_checkpoint_dir

    path = Path(target_path)
    if path == default_checkpoint_dir() / "target":
        return "eagletree-default"
    return path.name if path.name != "target" else path.parent.name
