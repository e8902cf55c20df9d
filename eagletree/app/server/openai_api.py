"""The HTTP application: the OpenAI-compatible routes over a started engine loop.

``create_app`` holds the loop and the server's options in ``app.state`` (``ServerState``) and
maps the paths to the module-level handlers of ``routes``; ``/v1`` paths need the API key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from eagletree.app.server import http_errors, routes
from eagletree.app.server.app_state import ServerState
from eagletree.app.server.request_body import MAX_BODY_BYTES

if TYPE_CHECKING:
    from eagletree.app.server.engine_loop import EngineLoop


def create_app(
    loop: EngineLoop,
    model_name: str,
    api_key: str | None = None,
    max_tokens_limit: int = 4096,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI application over a started ``loop``."""
    app = FastAPI(title="eagletree", docs_url=None, redoc_url=None)
    app.state.server = ServerState(loop, model_name, api_key, max_tokens_limit, max_body_bytes)
    http_errors.install(app)
    v1 = [Depends(routes.authorize)]
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    app.add_api_route("/v1/models", routes.models, methods=["GET"], dependencies=v1)
    app.add_api_route(
        "/v1/completions",
        routes.completions,
        methods=["POST"],
        response_model=None,
        dependencies=v1,
    )
    app.add_api_route(
        "/v1/chat/completions", routes.chat, methods=["POST"], response_model=None, dependencies=v1
    )
    return app
