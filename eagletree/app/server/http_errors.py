"""The server's error answers: every refused or failed request gets an OpenAI error body.

``install`` registers the handlers on an application: the routes raise ``BadRequest`` (400, or
its own status) or ``Unauthorized`` (401), the body reader ``RequestValidationError`` for a body
that does not fit the request schema, the router an ``HTTPException`` for an unknown path or
method; anything else is a failure of the server (500).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from eagletree.app.server.protocol import BadRequest, error_body


class Unauthorized(Exception):
    """A /v1 request without the server's API key."""


def install(app: FastAPI) -> None:
    """Answer the server's exceptions with OpenAI error bodies on ``app``."""
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(BadRequest, _bad)  # type: ignore[arg-type]
    app.add_exception_handler(Unauthorized, _unauthorized)
    app.add_exception_handler(HTTPException, _no_route)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _failed)


async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"] if part != "body")
    message = f"{where}: {problem['msg']}" if where else str(problem["msg"])
    return JSONResponse(error_body(message, "invalid_request_error", where or None), 400)


async def _bad(_: Request, error: BadRequest) -> JSONResponse:
    return JSONResponse(error_body(str(error), "invalid_request_error", error.param), error.status)


async def _unauthorized(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse(error_body("missing or wrong API key", "authentication_error"), 401)


async def _no_route(request: Request, error: HTTPException) -> JSONResponse:
    message = f"{error.detail}: {request.method} {request.url.path}"
    return JSONResponse(
        error_body(message, "invalid_request_error"), error.status_code, headers=error.headers
    )


async def _failed(_: Request, error: Exception) -> JSONResponse:
    # the traceback goes to the log (Starlette re-raises); the client learns what failed
    text = f"the server failed: {error}".encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse(error_body(text, "server_error"), 500)
