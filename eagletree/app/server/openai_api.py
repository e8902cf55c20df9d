"""The HTTP routes: OpenAI-compatible completions and chat, models, health, metrics.

Handlers never block on the engine: they queue requests into the ``EngineLoop`` and await the
events it posts back onto the event loop. A client that disconnects (a closed stream, or a
non-streaming request whose connection drops) aborts its requests, which frees their slots at
the engine's next step.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from eagletree.app.engine.streaming import StreamEvent
from eagletree.app.server.engine_loop import EngineLoop
from eagletree.app.server.openai_choices import (
    Choice,
    choices_usage,
    chunk_base,
    full_body,
    sse_chunk,
    sse_line,
)
from eagletree.app.server.protocol import (
    BadRequest,
    ChatBody,
    CompletionBody,
    StopStrings,
    error_body,
    new_id,
    now,
    openai_finish_reason,
)
from eagletree.domain.sampling_params import SamplingParams

DISCONNECT_POLL_S = 0.25


class _Unauthorized(Exception):
    """A /v1 request without the server's API key."""


def create_app(
    loop: EngineLoop, model_name: str, api_key: str | None = None, max_tokens_limit: int = 4096
) -> FastAPI:
    """The FastAPI application over a started ``loop``."""
    app = FastAPI(title="eagletree", docs_url=None, redoc_url=None)
    tokenizer = loop.engine.tokenizer

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"] if part != "body")
        message = f"{where}: {problem['msg']}" if where else str(problem["msg"])
        return JSONResponse(error_body(message, "invalid_request_error", where or None), 400)

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, error: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(str(error), "invalid_request_error", error.param), 400)

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_: Request, error: _Unauthorized) -> JSONResponse:
        return JSONResponse(error_body("missing or wrong API key", "authentication_error"), 401)

    # A dependency, not an HTTP middleware: a middleware wraps `receive`, and the handlers
    # could no longer see a client disconnect through it.
    async def authorize(request: Request) -> None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            raise _Unauthorized

    v1 = [Depends(authorize)]

    @app.get("/health")
    async def health() -> JSONResponse:
        if not loop.alive:
            return JSONResponse({"status": "engine stopped"}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(loop.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "eagletree"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", response_model=None, dependencies=v1)
    async def completions(body: CompletionBody, request: Request) -> Response:
        _check_common(body)
        if body.echo:
            raise BadRequest("echo is not supported", "echo")
        choices = [
            Choice(i, _encode(prompt, i), StopStrings(body.stop_strings))
            for i, prompt in enumerate(body.prompts())
        ]
        return await _serve(request, body, choices, body.max_tokens or 16, chat=False)

    @app.post("/v1/chat/completions", response_model=None, dependencies=v1)
    async def chat(body: ChatBody, request: Request) -> Response:
        _check_common(body)
        if tokenizer is None or not tokenizer.has_chat_template:
            raise BadRequest("the model has no chat template: use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = tokenizer.apply_chat_template(messages)
        except ValueError as error:
            raise BadRequest(str(error), "messages") from None
        choices = [Choice(0, ids, StopStrings(body.stop_strings))]
        max_tokens = body.max_completion_tokens or body.max_tokens or min(256, max_tokens_limit)
        return await _serve(request, body, choices, max_tokens, chat=True)

    def _check_common(body: CompletionBody | ChatBody) -> None:
        if body.model != model_name:
            raise BadRequest(
                f"model {body.model!r} is not served here; use {model_name!r}", "model"
            )
        if body.logprobs not in (None, False):
            raise BadRequest("logprobs are not supported", "logprobs")
        limit = body.max_tokens or getattr(body, "max_completion_tokens", None) or 0
        if limit > max_tokens_limit:
            raise BadRequest(
                f"max_tokens = {limit} exceeds this server's limit of {max_tokens_limit}",
                "max_tokens",
            )

    def _encode(prompt: str | list[int], index: int) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if tokenizer is None:
            raise BadRequest("the model has no tokenizer: send token ids as the prompt", "prompt")
        return tokenizer.encode(prompt)

    async def _serve(
        request: Request,
        body: CompletionBody | ChatBody,
        choices: list[Choice],
        max_tokens: int,
        *,
        chat: bool,
    ) -> Response:
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=body.temperature,
            top_k=body.top_k if body.temperature > 0 else None,
            top_p=body.top_p if body.temperature > 0 else None,
            seed=body.seed,
        )
        events: asyncio.Queue[tuple[int, StreamEvent | BaseException]] = asyncio.Queue()
        await _submit(choices, params, events, "messages" if chat else "prompt")
        meta = {"id": new_id("chatcmpl" if chat else "cmpl"), "created": now(), "model": model_name}
        if body.stream:
            stream = _sse(choices, events, meta, chat=chat, include_usage=body.include_usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        try:
            await _collect(request, choices, events)
        finally:
            _abort_unfinished(choices)
        return JSONResponse(full_body(choices, meta, chat=chat))

    async def _submit(
        choices: list[Choice],
        params: SamplingParams,
        events: asyncio.Queue[tuple[int, StreamEvent | BaseException]],
        param: str,
    ) -> None:
        aio = asyncio.get_running_loop()
        for choice in choices:

            def sink(event: StreamEvent | BaseException, index: int = choice.index) -> None:
                aio.call_soon_threadsafe(events.put_nowait, (index, event))

            try:
                choice.request_id = await asyncio.wrap_future(
                    loop.submit(choice.prompt_ids, params, sink)
                )
            except ValueError as error:
                _abort_unfinished(choices)
                # "request N: ..." names the engine's request id; the client knows its prompt
                message = re.sub(r"^request \d+: ", "", str(error))
                if len(choices) > 1:
                    message = f"prompt {choice.index}: {message}"
                raise BadRequest(message, param) from None

    def _apply(choice: Choice, event: StreamEvent) -> str:
        """Fold an event into its choice; the text it adds (cut at a stop string)."""
        choice.num_tokens += len(event.token_ids)
        text = choice.stops.push(event.text, final=event.finished)
        choice.text += text
        if choice.stops.stopped and choice.finish_reason is None:
            choice.finish_reason = "stop"
            _abort(choice)
        elif event.finished and choice.finish_reason is None:
            choice.finish_reason = openai_finish_reason(event.finish_reason)
        if event.finished:
            choice.request_id = None
        return text

    def _abort(choice: Choice) -> None:
        if choice.request_id is not None:
            loop.abort(choice.request_id)

    def _abort_unfinished(choices: list[Choice]) -> None:
        for choice in choices:
            _abort(choice)
            choice.request_id = None

    async def _next(
        events: asyncio.Queue[tuple[int, StreamEvent | BaseException]],
    ) -> tuple[int, StreamEvent]:
        index, event = await events.get()
        if isinstance(event, BaseException):
            raise RuntimeError(f"the engine failed: {event}")
        return index, event

    async def _collect(
        request: Request,
        choices: list[Choice],
        events: asyncio.Queue[tuple[int, StreamEvent | BaseException]],
    ) -> None:
        pending = {choice.index for choice in choices}
        checked = time.monotonic()
        while pending:
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # tokens may never pause
                checked = time.monotonic()
                if await request.is_disconnected():
                    return  # the caller's finally aborts what is left
            try:
                index, event = await asyncio.wait_for(_next(events), DISCONNECT_POLL_S)
            except TimeoutError:
                continue
            _apply(choices[index], event)
            if event.finished:
                pending.discard(index)

    async def _sse(
        choices: list[Choice],
        events: asyncio.Queue[tuple[int, StreamEvent | BaseException]],
        meta: dict[str, Any],
        *,
        chat: bool,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        pending = {choice.index for choice in choices}
        try:
            if chat:
                yield sse_chunk(meta, 0, {"role": "assistant", "content": ""}, None, chat=True)
            while pending:
                index, event = await _next(events)
                choice = choices[index]
                was_done = choice.finish_reason is not None
                text = _apply(choice, event)
                if event.finished:
                    pending.discard(index)
                if was_done:
                    continue  # a stop string ended it; the engine's last event adds nothing
                if text:
                    delta = {"content": text} if chat else text
                    yield sse_chunk(meta, index, delta, None, chat=chat)
                if choice.finish_reason is not None:
                    yield sse_chunk(
                        meta, index, {} if chat else "", choice.finish_reason, chat=chat
                    )
            if include_usage:
                total = choices_usage(choices)
                yield sse_line({**chunk_base(meta, chat), "choices": [], "usage": total})
            yield "data: [DONE]\n\n"
        finally:
            _abort_unfinished(choices)

    return app
