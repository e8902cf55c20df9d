"""One HTTP request's choices as they run on the engine loop: submitted, collected, streamed.

A ``ChoiceRun`` lives on the event loop of the request that made it. The engine loop's thread
posts each choice's events onto that event loop (``call_soon_threadsafe``); the run folds them
into the choices, cuts the text at stop strings and aborts what its client no longer waits for.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from eagletree.app.server.openai_choices import (
    Choice,
    choices_usage,
    chunk_base,
    sse_chunk,
    sse_line,
)
from eagletree.app.server.protocol import BadRequest, openai_finish_reason

if TYPE_CHECKING:
    from fastapi import Request

    from eagletree.app.engine.streaming import StreamEvent
    from eagletree.app.server.engine_loop import EngineLoop, Sink
    from eagletree.domain.sampling import SamplingParams

DISCONNECT_POLL_S = 0.25


class ChoiceRun:
    """The choices of one HTTP request on ``loop``; build it on the request's event loop."""

    def __init__(self, loop: EngineLoop, choices: list[Choice]) -> None:
        self._loop = loop
        self.choices = choices
        self._aio = asyncio.get_running_loop()
        self._events: asyncio.Queue[tuple[int, StreamEvent | BaseException]] = asyncio.Queue()

    async def submit(self, params: SamplingParams, param: str) -> None:
        """Queue every choice on the engine loop; a refused one aborts the others and is a
        ``BadRequest`` naming ``param``."""
        for choice in self.choices:
            try:
                choice.request_id = await asyncio.wrap_future(
                    self._loop.submit(choice.prompt_ids, params, self._sink(choice.index))
                )
            except ValueError as error:
                self.abort_unfinished()
                # "request N: ..." names the engine's request id; the client knows its prompt
                message = re.sub(r"^request \d+: ", "", str(error))
                if len(self.choices) > 1:
                    message = f"prompt {choice.index}: {message}"
                raise BadRequest(message, param) from None

    def _sink(self, index: int) -> Sink:
        def sink(event: StreamEvent | BaseException) -> None:  # on the engine loop's thread
            self._aio.call_soon_threadsafe(self._events.put_nowait, (index, event))

        return sink

    async def collect(self, request: Request) -> None:
        """Wait until every choice finished, or the client went away (checked every
        ``DISCONNECT_POLL_S``, as tokens may never pause); the caller aborts what is left."""
        pending = {choice.index for choice in self.choices}
        checked = time.monotonic()
        while pending:
            if time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            try:
                index, event = await asyncio.wait_for(self._next(), DISCONNECT_POLL_S)
            except TimeoutError:
                continue
            self._apply(self.choices[index], event)
            if event.finished:
                pending.discard(index)

    async def stream(
        self, meta: dict[str, Any], *, chat: bool, include_usage: bool
    ) -> AsyncIterator[str]:
        """The server-sent events of the choices; a closed stream aborts what is left."""
        pending = {choice.index for choice in self.choices}
        try:
            if chat:
                yield sse_chunk(meta, 0, {"role": "assistant", "content": ""}, None, chat=True)
            while pending:
                index, event = await self._next()
                choice = self.choices[index]
                was_done = choice.finish_reason is not None
                text = self._apply(choice, event)
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
                total = choices_usage(self.choices)
                yield sse_line({**chunk_base(meta, chat), "choices": [], "usage": total})
            yield "data: [DONE]\n\n"
        finally:
            self.abort_unfinished()

    def abort_unfinished(self) -> None:
        for choice in self.choices:
            self._abort(choice)
            choice.request_id = None

    async def _next(self) -> tuple[int, StreamEvent]:
        index, event = await self._events.get()
        if isinstance(event, BaseException):
            raise RuntimeError(f"the engine failed: {event}")
        return index, event

    def _apply(self, choice: Choice, event: StreamEvent) -> str:
        """Fold an event into its choice; the text it adds (cut at a stop string)."""
        choice.num_tokens += len(event.token_ids)
        text = choice.stops.push(event.text, final=event.finished)
        choice.text += text
        if choice.stops.stopped and choice.finish_reason is None:
            choice.finish_reason = "stop"
            self._abort(choice)
        elif event.finished and choice.finish_reason is None:
            choice.finish_reason = openai_finish_reason(event.finish_reason)
        if event.finished:
            choice.request_id = None
        return text

    def _abort(self, choice: Choice) -> None:
        if choice.request_id is not None:
            self._loop.abort(choice.request_id)
