"""The OpenAI response shapes of one HTTP request's choices: the streamed chunks and the whole
body, as ``routes`` and ``choice_run`` send them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eagletree.app.server.protocol import StopStrings, usage


@dataclass(slots=True)
class Choice:
    """One prompt of an HTTP request, as the engine runs it."""

    index: int
    prompt_ids: list[int]
    stops: StopStrings
    request_id: int | None = None
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None


def chunk_base(meta: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The fields every streamed chunk of a response shares."""
    return {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}


def sse_chunk(
    meta: dict[str, Any], index: int, delta: Any, finish: str | None, *, chat: bool
) -> str:
    """One server-sent event of choice ``index``: its new text (or chat delta), or its end."""
    choice: dict[str, Any] = {"index": index, "finish_reason": finish}
    if chat:
        choice["delta"] = delta
    else:
        choice["text"] = delta
        choice["logprobs"] = None
    return sse_line({**chunk_base(meta, chat), "choices": [choice]})


def choices_usage(choices: list[Choice]) -> dict[str, int]:
    """The OpenAI usage object of a request's choices."""
    return usage(sum(len(c.prompt_ids) for c in choices), sum(c.num_tokens for c in choices))


def full_body(choices: list[Choice], meta: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The whole (non-streamed) completion or chat completion response."""
    if chat:
        body_choices: list[dict[str, Any]] = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ]
        kind = "chat.completion"
    else:
        body_choices = [
            {
                "index": c.index,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            for c in choices
        ]
        kind = "text_completion"
    return {**meta, "object": kind, "choices": body_choices, "usage": choices_usage(choices)}


def sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
