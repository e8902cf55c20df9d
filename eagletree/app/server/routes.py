"""The HTTP handlers: OpenAI-compatible completions and chat, models, health, metrics.

Each handler gets its application's ``ServerState`` through a dependency and reads its body
itself (``request_body``), so that every malformed body is an OpenAI error. Handlers never
block on the engine: they queue the request's choices on the engine loop (``ChoiceRun``) and
await the events it posts back. A client that disconnects (a closed stream, or a non-streaming
request whose connection drops) aborts its requests, which frees their slots at the engine's
next step.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from eagletree.app.server.app_state import ServerState, server_state
from eagletree.app.server.choice_run import ChoiceRun
from eagletree.app.server.http_errors import Unauthorized
from eagletree.app.server.openai_choices import Choice, full_body
from eagletree.app.server.protocol import (
    BadRequest,
    ChatBody,
    CompletionBody,
    StopStrings,
    new_id,
    now,
)
from eagletree.app.server.request_body import read_body
from eagletree.app.server.token_limits import max_new_tokens
from eagletree.domain.sampling import SamplingParams

State = Annotated[ServerState, Depends(server_state)]


# A dependency, not an HTTP middleware: a middleware wraps `receive`, and the handlers could no
# longer see a client disconnect through it.
async def authorize(request: Request, state: State) -> None:
    if state.api_key and request.headers.get("authorization") != f"Bearer {state.api_key}":
        raise Unauthorized


async def health(state: State) -> JSONResponse:
    if not state.loop.alive:
        return JSONResponse({"status": "engine stopped"}, 503)
    return JSONResponse({"status": "ok"})


async def metrics(state: State) -> PlainTextResponse:
    return PlainTextResponse(state.loop.metrics.render(), media_type="text/plain; version=0.0.4")


async def models(state: State) -> dict[str, Any]:
    card = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "eagletree"}
    return {"object": "list", "data": [card]}


async def completions(request: Request, state: State) -> Response:
    body = await read_body(request, CompletionBody, state.max_body_bytes)
    max_tokens = _check_common(state, body)
    if body.echo:
        raise BadRequest("echo is not supported", "echo")
    choices = [
        Choice(i, _encode(state, prompt), StopStrings(body.stop_strings))
        for i, prompt in enumerate(body.prompts())
    ]
    return await _serve(request, state, body, choices, max_tokens, chat=False)


async def chat(request: Request, state: State) -> Response:
    body = await read_body(request, ChatBody, state.max_body_bytes)
    max_tokens = _check_common(state, body)
    tokenizer = state.tokenizer
    if tokenizer is None or not tokenizer.has_chat_template:
        raise BadRequest("the model has no chat template: use /v1/completions", "messages")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        ids = tokenizer.apply_chat_template(messages)
    except ValueError as error:
        raise BadRequest(str(error), "messages") from None
    choices = [Choice(0, ids, StopStrings(body.stop_strings))]
    return await _serve(request, state, body, choices, max_tokens, chat=True)


def _check_common(state: ServerState, body: CompletionBody | ChatBody) -> int:
    """Check what both endpoints share; the most tokens the request generates."""
    if body.model != state.model_name:
        raise BadRequest(
            f"model {body.model!r} is not served here; use {state.model_name!r}", "model"
        )
    if body.logprobs not in (None, False):
        raise BadRequest("logprobs are not supported", "logprobs")
    return max_new_tokens(body, state.max_tokens_limit)


def _encode(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    if state.tokenizer is None:
        raise BadRequest("the model has no tokenizer: send token ids as the prompt", "prompt")
    return state.tokenizer.encode(prompt)


async def _serve(
    request: Request,
    state: ServerState,
    body: CompletionBody | ChatBody,
    choices: list[Choice],
    max_tokens: int,
    *,
    chat: bool,
) -> Response:
    """Run the choices; the whole response, or its stream of server-sent events."""
    vocab_size = state.loop.engine.vocab_size
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=body.temperature,
        # a top_k past the vocabulary keeps every token, as the vocabulary does, and fits the
        # engine's int64 sampling tensors
        top_k=min(body.top_k, vocab_size) if body.top_k and body.temperature > 0 else None,
        top_p=body.top_p if body.temperature > 0 else None,
        seed=body.seed,
    )
    run = ChoiceRun(state.loop, choices)
    await run.submit(params, "messages" if chat else "prompt")
    meta = {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "created": now(),
        "model": state.model_name,
    }
    if body.stream:
        stream = run.stream(meta, chat=chat, include_usage=body.include_usage)
        return StreamingResponse(stream, media_type="text/event-stream")
    try:
        await run.collect(request)
    finally:
        run.abort_unfinished()
    return JSONResponse(full_body(choices, meta, chat=chat))
