"""The server's limits hold for every request: no combination of ``max_tokens``,
``max_completion_tokens`` and the defaults generates past ``--max-tokens-limit`` (a property
over the request schema, through the application and a real engine), a ``top_k`` past any
integer the engine holds is served, not a crash of the engine loop, and a body past the size
limit is refused without being read to its end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eagletree.app.server.engine_loop import EngineLoop, Sink
from eagletree.app.server.openai_api import create_app
from eagletree.app.server.protocol import ChatBody, ChatMessage
from eagletree.app.server.token_limits import max_new_tokens
from eagletree.domain.sampling import SamplingParams
from tests.hypothesis_profiles import examples
from tests.integration.server.conftest import server_engine

MODEL = "tiny"
ABSENT = "absent"  # the field is left out of the body
DEFAULTS = {"completion": 16, "chat": 256}


class RecordingLoop(EngineLoop):
    """An engine loop that remembers the sampling parameters of what it was asked to run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted: list[SamplingParams] = []

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> Future[int]:
        self.submitted.append(params)
        return super().submit(prompt_ids, params, sink)


@pytest.fixture(scope="module")
def loop(server_cache: Path) -> Iterator[RecordingLoop]:
    loop = RecordingLoop(server_engine(server_cache))
    loop.start()
    yield loop
    loop.stop()


def post(loop: RecordingLoop, limit: int, kind: str, fields: dict[str, object]) -> Any:
    """POST a greedy request of ``kind`` with ``fields`` to a server limited to ``limit``."""
    loop.submitted.clear()
    body: dict[str, object] = {"model": MODEL, "temperature": 0, **fields}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "hello tree"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "The draft tree"
        path = "/v1/completions"
    client = TestClient(create_app(loop, MODEL, max_tokens_limit=limit))
    return client.post(path, json=body)


def expected(kind: str, fields: dict[str, object], limit: int) -> int | set[str]:
    """The tokens the request may generate, or the fields that it is refused for."""
    names = ["max_completion_tokens", "max_tokens"] if kind == "chat" else ["max_tokens"]
    given_ = {name: fields[name] for name in names if fields.get(name) is not None}
    malformed = {n for n, v in given_.items() if not (type(v) is int and v >= 1)}
    if malformed:
        return malformed
    asked = {n: v for n, v in given_.items() if isinstance(v, int)}
    over = {n for n, v in asked.items() if v > limit}
    if over:
        return over
    for name in names:  # chat: max_completion_tokens supersedes max_tokens
        if name in asked:
            return asked[name]
    return min(DEFAULTS[kind], limit)


token_field = st.one_of(
    st.just(ABSENT),
    st.none(),
    st.booleans(),
    st.integers(-1, 10),
    st.integers(10, 10**30),
    st.floats(-1, 10, allow_nan=False),
    st.text("0123456789", min_size=1, max_size=2),
)


@given(
    kind=st.sampled_from(["completion", "chat"]),
    max_tokens=token_field,
    max_completion_tokens=token_field,
    limit=st.integers(1, 6),
)
@example(kind="completion", max_tokens=ABSENT, max_completion_tokens=ABSENT, limit=8)
@example(kind="chat", max_tokens=1, max_completion_tokens=100, limit=8)
@example(kind="chat", max_tokens=100, max_completion_tokens=1, limit=8)
@example(kind="completion", max_tokens=True, max_completion_tokens=ABSENT, limit=8)
@settings(max_examples=examples(100))
def test_no_combination_of_token_fields_generates_past_the_limit(
    loop: RecordingLoop, kind: str, max_tokens: object, max_completion_tokens: object, limit: int
) -> None:
    asked = {"max_tokens": max_tokens, "max_completion_tokens": max_completion_tokens}
    fields = {name: value for name, value in asked.items() if value != ABSENT}
    answer = post(loop, limit, kind, fields)
    want = expected(kind, fields, limit)
    if isinstance(want, set):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] in want, answer.text
        assert loop.submitted == []
        return
    assert answer.status_code == 200, answer.text
    assert [params.max_new_tokens for params in loop.submitted] == [want]
    choice = answer.json()["choices"][0]
    generated = answer.json()["usage"]["completion_tokens"]
    assert generated <= want <= limit
    assert generated == want or choice["finish_reason"] == "stop"


def test_a_request_without_token_fields_generates_the_default_lowered_to_the_limit(
    loop: RecordingLoop,
) -> None:
    for kind in DEFAULTS:
        assert post(loop, 4, kind, {}).status_code == 200
        assert loop.submitted[0].max_new_tokens == 4
    assert post(loop, 4096, "completion", {}).status_code == 200
    assert loop.submitted[0].max_new_tokens == DEFAULTS["completion"]
    # a chat's default, 256 tokens, is checked without generating them
    chat = ChatBody(model=MODEL, messages=[ChatMessage(role="user", content="x")])
    assert max_new_tokens(chat, 4096) == DEFAULTS["chat"]


def test_a_top_k_past_int64_keeps_every_token_and_the_engine_serves_on(
    loop: RecordingLoop,
) -> None:
    fields = {"max_tokens": 3, "temperature": 0.7, "seed": 5}
    for top_k in (10**30, 2**63, loop.engine.vocab_size):
        answer = post(loop, 8, "completion", {**fields, "top_k": top_k})
        assert answer.status_code == 200, answer.text
        assert loop.submitted[0].top_k == loop.engine.vocab_size
    assert loop.alive


@pytest.mark.parametrize("declared", [False, True])
def test_a_body_past_the_size_limit_is_refused_without_reading_the_rest(
    loop: RecordingLoop, declared: bool
) -> None:
    """1 MiB sent in 1 KiB chunks to a 64 KiB limit through the application's ASGI interface:
    with a Content-Length the body is refused unread; without one (chunked), at the chunk that
    goes past the limit."""
    app = create_app(loop, MODEL, max_body_bytes=2**16)
    chunk, offered = b"x" * 1024, 1024
    received = 0
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        return {"type": "http.request", "body": chunk, "more_body": received < offered}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    if declared:
        headers.append((b"content-length", str(len(chunk) * offered).encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert received == (0 if declared else 2**16 // len(chunk) + 1)
    assert b"larger than this server reads (65536 bytes)" in sent[1]["body"]
