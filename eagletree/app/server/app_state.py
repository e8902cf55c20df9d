"""What the HTTP application holds: the engine loop it serves and the server's options.

``create_app`` puts one ``ServerState`` on ``app.state``; the handlers get it through the
``server_state`` dependency, so two applications in one process never share anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

if TYPE_CHECKING:
    from eagletree.app.server.engine_loop import EngineLoop
    from eagletree.ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class ServerState:
    """The started engine loop, the served model's name, the API key (None: none needed), the
    most tokens a request may generate and the largest body it may send."""

    loop: EngineLoop
    model_name: str
    api_key: str | None
    max_tokens_limit: int
    max_body_bytes: int

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.loop.engine.tokenizer


def server_state(request: Request) -> ServerState:
    """The dependency that hands a handler its application's state."""
    state: ServerState = request.app.state.server
    return state
