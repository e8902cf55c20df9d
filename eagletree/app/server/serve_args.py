"""The `eagletree serve` options (kept apart so that the CLI parser does not import FastAPI)."""

from __future__ import annotations

import argparse
from typing import Any

from eagletree.app.parallel.launch import add_parallel_flags

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``eagletree`` subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server over one engine (or its parallel ranks)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
        "/metrics. Without model.target_path in the settings the embedded default model is "
        "served. Binds to 127.0.0.1 unless --host says otherwise.",
    )
    parser.add_argument("--settings", metavar="FILE", help="a .toml, .yaml or .yml settings file")
    parser.add_argument("--host", default=DEFAULT_HOST, help="default: %(default)s (local only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $EAGLETREE_API_KEY, else none)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name clients send (default: the checkpoint directory's name)",
    )
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        default=4096,
        metavar="N",
        help="most tokens one request may generate, whatever it asks for (at least 1; "
        "default: %(default)s)",
    )
    add_parallel_flags(
        parser,
        tp_help_end="; rank 0 serves HTTP",
        dp_help="replicas (parallel.dp_size), each with its own requests and KV pool; rank 0 "
        "places each request on the least loaded one",
    )
    return parser
