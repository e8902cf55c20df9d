"""The OpenAI wire format: request bodies (validated), response and chunk bodies, stop strings.

Only what the engine can do is accepted: one choice per prompt (n = 1), no logprobs, no
echo. Unknown fields are ignored, as OpenAI clients send optional ones freely; a field the
server cannot honour is a 400 that names it. Known fields are validated strictly, as JSON
types: a string is not a number, and neither is ``true``.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from eagletree.domain.request import FinishReason


class BadRequest(ValueError):
    """A request the server rejects with ``status`` (400; ``request_body.TooLarge`` 413);
    ``param`` names the field, when one is at fault."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _not_a_boolean(value: object) -> object:
    # Python's bool is an int, and a lax model would read JSON's true as 1
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "a number is expected, not a boolean")
    return value


_Number = BeforeValidator(_not_a_boolean)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: Annotated[int | None, _Number] = Field(default=None, ge=1)
    temperature: Annotated[float, _Number] = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Annotated[float | None, _Number] = Field(default=None, gt=0.0, le=1.0)
    # top_k is an extension (vLLM and SGLang accept it)
    top_k: Annotated[int | None, _Number] = Field(default=None, ge=1)
    seed: Annotated[int | None, _Number] = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, _Number] = 1
    logprobs: Any = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n = 1 is supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not stop for stop in stops):
            raise ValueError("stop must be up to 4 non-empty strings")
        return value

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise BadRequest("prompt is empty", "prompt")
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest("only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    # supersedes max_tokens, which OpenAI deprecates for chat (``token_limits``)
    max_completion_tokens: Annotated[int | None, _Number] = Field(default=None, ge=1)


def openai_finish_reason(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}[reason.value]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class StopStrings:
    """Cuts generated text at the first stop string; holds back a tail that may start one."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._pending = ""
        self.stopped = False

    def push(self, delta: str, final: bool = False) -> str:
        """The text safe to emit now; ``stopped`` turns True at a stop string (cut before it)."""
        if self.stopped:
            return ""
        text = self._pending + delta
        cut = min((text.find(s) for s in self._stops if s in text), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return text[:cut]
        keep = 0 if final else self._held_back(text)
        self._pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _held_back(self, text: str) -> int:
        for size in range(min(len(text), max((len(s) for s in self._stops), default=1) - 1), 0, -1):
            if any(stop.startswith(text[-size:]) for stop in self._stops):
                return size
        return 0
