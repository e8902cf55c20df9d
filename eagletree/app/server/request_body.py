"""Reading a request's body: one JSON object in UTF-8, bounded in size and nesting, whose
strings are Unicode text, validated against the endpoint's schema.

Every way a body can fail is a ``BadRequest`` (413 for the size) or a validation error, so the
client gets an OpenAI error body naming the field, never a parser's own answer or a 500. A lone
surrogate (``"\\ud800"``) is valid JSON but not text: refused here, it would otherwise reach
the tokenizer, or an error message that cannot be encoded.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from eagletree.app.server.protocol import BadRequest

if TYPE_CHECKING:
    from fastapi import Request

MAX_BODY_BYTES = 32 * 2**20
MAX_DEPTH = 64  # the schema nests 5 deep; unknown fields (tools' JSON schemas) get the rest

Body = TypeVar("Body", bound=BaseModel)
_Node = dict[str, object] | list[object]


class TooLarge(BadRequest):
    """A body over the server's size limit."""

    status = 413


async def read_body(request: Request, schema: type[Body], max_bytes: int) -> Body:
    """The request's body as ``schema``; a ``BadRequest`` (or a ``RequestValidationError``)
    saying what is wrong with it."""
    value = parse_json(await _read(request, max_bytes))
    try:
        return schema.model_validate(value)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


async def _read(request: Request, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of body; refused as soon as it says or shows it holds more."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict[str, object]:
    """``raw`` as a JSON object of Unicode text at most ``MAX_DEPTH`` deep."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise BadRequest(
            f"the body is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
            f"{error.start}): send JSON encoded in UTF-8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as error:
        raise BadRequest(
            f"the body is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as error:  # NaN or Infinity, or an integer of thousands of digits
        # Python's own advice for the digits (sys.set_int_max_str_digits) is not the client's
        raise BadRequest(f"the body is not valid JSON: {str(error).split('; ')[0]}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the body must be a JSON object, not {_json_type(value)}")
    _check_tree(value)
    return value


def _check_tree(root: dict[str, object]) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and strings (keys too) that are not text."""
    stack: list[tuple[_Node, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_DEPTH:
            raise _too_deep()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and not _is_text(key):
                raise _lone_surrogate(path, key, key)
            if isinstance(child, str):
                if not _is_text(child):
                    raise _lone_surrogate(path, key, child)
            elif isinstance(child, dict | list):
                stack.append((child, (*path, key)))


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(path: tuple[str | int, ...], key: str | int, value: str) -> BadRequest:
    surrogate = next(char for char in value if "\ud800" <= char <= "\udfff")
    # the key itself may hold the surrogate: written escaped, the error body stays encodable
    where = ".".join(str(part) for part in (*path, key))
    where = where.encode("utf-8", "backslashreplace").decode("utf-8")
    return BadRequest(
        f"{where}: the lone surrogate {surrogate!r} is not Unicode text (a JSON \\u escape of "
        "a character past U+FFFF takes a pair of them)",
        where,
    )


def _not_a_number(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep() -> BadRequest:
    return BadRequest(f"the body nests deeper than {MAX_DEPTH} levels of arrays and objects")


def _too_large(max_bytes: int) -> TooLarge:
    return TooLarge(f"the body is larger than this server reads ({max_bytes} bytes)")


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
