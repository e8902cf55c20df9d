"""The requests `eagletree serve` refuses, one per row of the "Server" table in docs/errors.md:
each with the words of its message and the field its error body names.

Data only (no FastAPI), so that
tests/integration/test_a_mistake_is_one_line_naming_what_to_change.py can check the table
against these ids where the serve extra is not installed; test_bad_requests.py sends them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerCase:
    """A request ``eagletree serve`` refuses: its body, the words of the message, the field."""

    body: bytes
    words: str
    param: str | None
    status: int = 400
    path: str = "/v1/completions"
    method: str = "POST"


SERVED = "m"  # the server the cases run on: --max-tokens-limit 8, bodies up to BODY_LIMIT
BODY_LIMIT = 2**20
CHAT = b'"model": "m", "messages": [{"role": "user", "content": "hi"}]'
SERVER_CASES: dict[str, ServerCase] = {
    "server-max-tokens-above-limit": ServerCase(
        b'{"model": "m", "prompt": "x", "max_tokens": 9}', "limit of 8", "max_tokens"
    ),
    "server-max-completion-tokens-above-limit": ServerCase(
        b"{" + CHAT + b', "max_tokens": 1, "max_completion_tokens": 100}',
        "max_completion_tokens = 100 exceeds this server's limit of 8",
        "max_completion_tokens",
        path="/v1/chat/completions",
    ),
    "server-max-tokens-boolean": ServerCase(
        b'{"model": "m", "prompt": "x", "max_tokens": true}', "not a boolean", "max_tokens"
    ),
    "server-temperature-boolean": ServerCase(
        b'{"model": "m", "prompt": "x", "temperature": true}', "not a boolean", "temperature"
    ),
    "server-bad-json": ServerCase(
        b'{"model": "m", "prompt": "x",}', "not valid JSON: Expecting property name", None
    ),
    "server-empty-body": ServerCase(b"", "not valid JSON: Expecting value", None),
    "server-not-an-object": ServerCase(b'["m", "x"]', "must be a JSON object, not an array", None),
    "server-not-utf8": ServerCase(
        b'{"model": "m", "prompt": "caf\xe9"}', "not UTF-8 text (byte 0xe9 at offset 29)", None
    ),
    "server-nan": ServerCase(
        b'{"model": "m", "prompt": "x", "temperature": NaN}', "NaN is not a JSON number", None
    ),
    "server-integer-of-5000-digits": ServerCase(
        b'{"model": "m", "prompt": "x", "seed": 1' + b"0" * 5000 + b"}", "4300 digits", None
    ),
    "server-nested-65-deep": ServerCase(
        b'{"model": "m", "prompt": "x", "tools": ' + b"[" * 64 + b"]" * 64 + b"}",
        "nests deeper than 64 levels",
        None,
    ),
    "server-nested-100000-deep": ServerCase(
        b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64 levels", None
    ),
    "server-lone-surrogate": ServerCase(
        b'{"model": "m", "prompt": "\\ud800", "max_tokens": 2}', "lone surrogate", "prompt"
    ),
    "server-lone-surrogate-chat": ServerCase(
        b'{"model": "m", "messages": [{"role": "user", "content": "a\\udc00"}]}',
        "lone surrogate '\\udc00' is not Unicode text",
        "messages.0.content",
        path="/v1/chat/completions",
    ),
    "server-lone-surrogate-key": ServerCase(
        b'{"model": "m", "prompt": "x", "\\ud800": 1}', "lone surrogate", "\\ud800"
    ),
    "server-body-too-large": ServerCase(
        b'{"model": "m", "prompt": "' + b"x" * BODY_LIMIT + b'"}', "larger than", None, 413
    ),
    "server-unknown-path": ServerCase(
        b"{}", "Not Found: POST /v1/complete", None, 404, "/v1/complete"
    ),
    "server-wrong-method": ServerCase(
        b"", "Method Not Allowed: GET /v1/completions", None, 405, method="GET"
    ),
}
