"""Every request of bad_requests.py is refused with its status and an OpenAI error body that
names the field, by the server's application in this process (no socket), and the engine loop
serves on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from eagletree.app.server.engine_loop import EngineLoop
from eagletree.app.server.openai_api import create_app
from tests.integration.server.bad_requests import BODY_LIMIT, SERVED, SERVER_CASES
from tests.integration.server.conftest import server_engine


@pytest.fixture(scope="module")
def server(server_cache: Path) -> Iterator[TestClient]:
    loop = EngineLoop(server_engine(server_cache))
    loop.start()
    app = create_app(loop, SERVED, max_tokens_limit=8, max_body_bytes=BODY_LIMIT)
    yield TestClient(app, raise_server_exceptions=False)
    loop.stop()


@pytest.mark.parametrize("case", sorted(SERVER_CASES))
def test_a_bad_request_is_an_openai_error_naming_the_field(case: str, server: TestClient) -> None:
    bad = SERVER_CASES[case]
    headers = {"content-type": "application/json"}
    answer = server.request(bad.method, bad.path, content=bad.body, headers=headers)
    assert answer.status_code == bad.status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert bad.words in error["message"] and error["param"] == bad.param, error
    assert error["type"] == "invalid_request_error"
    assert server.get("/health").json() == {"status": "ok"}
