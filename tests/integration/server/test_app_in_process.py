"""The server's application in this process (uvicorn in a thread on 127.0.0.1): API key,
stop strings, prompt batches, usage chunks, malformed bodies, metrics text, engine failure."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from eagletree import Engine
from eagletree.app.server.engine_loop import EngineLoop
from eagletree.app.server.openai_api import create_app
from eagletree.app.server.protocol import StopStrings
from tests.integration.server.conftest import server_engine

KEY = "secret-key"
MODEL = "tiny"


@dataclass
class App:
    url: str
    loop: EngineLoop  # owns its engine: tests compare against ``reference_engine``


@pytest.fixture(scope="module")
def app(server_cache: Path) -> Iterator[App]:
    loop = EngineLoop(server_engine(server_cache))
    loop.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(loop, MODEL, api_key=KEY, max_tokens_limit=64), log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield App(f"http://127.0.0.1:{port}", loop)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        loop.stop()
        sock.close()
    assert not thread.is_alive() and not loop.alive


def client(app: App, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=app.url + "/v1", api_key=key, timeout=60, max_retries=0)


def post(app: App, path: str, body: bytes, key: str = KEY) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        app.url + path,
        data=body,
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_wrong_api_key_is_refused_and_health_needs_none(app: App) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(app, key="wrong").models.list()
    assert [m.id for m in client(app).models.list().data] == [MODEL]
    with urllib.request.urlopen(app.url + "/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok"}


def test_a_stop_string_cuts_the_text_and_frees_the_request(
    app: App, reference_engine: Engine
) -> None:
    (reference,) = reference_engine.generate(["The draft tree"], max_new_tokens=24)
    assert reference.text is not None and len(reference.text) > 6
    stop = reference.text[3:6]  # a piece the output is known to contain
    cut = reference.text[: reference.text.find(stop)]
    api = client(app)
    full = api.completions.create(
        model=MODEL, prompt="The draft tree", max_tokens=24, temperature=0, stop=stop
    )
    assert (full.choices[0].text, full.choices[0].finish_reason) == (cut, "stop")
    chunks = list(
        api.completions.create(
            model=MODEL, prompt="The draft tree", max_tokens=24, temperature=0, stop=[stop],
            stream=True,
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 20
    while app.loop.metrics.num_running:  # the aborted request is released at the next step
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_dropped_connection_aborts_a_request_that_is_not_streamed(app: App) -> None:
    metrics = app.loop.metrics
    aborts_before = metrics.num_client_aborts
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 64, "temperature": 0}
    connection = http.client.HTTPConnection("127.0.0.1", int(app.url.rsplit(":", 1)[1]), timeout=10)
    connection.request(
        "POST", "/v1/completions", json.dumps(body),
        {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while metrics.num_running == 0:  # running: the handler waits for its tokens
        assert time.monotonic() < deadline
        time.sleep(0.01)
    connection.close()  # without reading the answer
    while metrics.num_client_aborts == aborts_before or metrics.num_running:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    assert metrics.finished["abort"] >= 1


def test_a_batch_of_prompts_gets_one_choice_each_and_usage(app: App) -> None:
    prompts = ["a b", "tree"]
    api = client(app)
    response = api.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0)
    assert [c.index for c in response.choices] == [0, 1]
    assert response.usage is not None and response.usage.completion_tokens == 10
    chunks = list(
        api.completions.create(
            model=MODEL, prompt=prompts, max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == [c.text for c in response.choices]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == (
        response.usage.total_tokens
    )


def test_token_id_prompts_are_accepted(app: App, reference_engine: Engine) -> None:
    (reference,) = reference_engine.generate([[1, 5, 9]], max_new_tokens=4)
    response = client(app).completions.create(
        model=MODEL, prompt=[1, 5, 9], max_tokens=4, temperature=0
    )
    assert response.choices[0].text == reference.text


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "JSON"),
        (b'{"model": "tiny"}', "prompt"),
        (b'{"model": "tiny", "prompt": "x", "echo": true}', "echo is not supported"),
        (b'{"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', "up to 4"),
        (b'{"model": "tiny", "prompt": "x", "max_tokens": 65}', "limit of 64"),
        (b'{"model": "tiny", "prompt": []}', "prompt is empty"),
    ],
)
def test_malformed_bodies_are_400s_naming_the_problem(app: App, body: bytes, words: str) -> None:
    status, answer = post(app, "/v1/completions", body)
    assert status == 400
    error = answer["error"]
    assert isinstance(error, dict) and words in str(error["message"])
    assert error["type"] == "invalid_request_error"


def test_a_request_the_engine_loop_cannot_take_is_a_server_error_body(
    reference_engine: Engine,
) -> None:
    stopped = EngineLoop(reference_engine)  # never started
    client = TestClient(create_app(stopped, MODEL), raise_server_exceptions=False)
    answer = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": {
            "message": "the server failed: the engine loop is not running",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


def test_chat_content_parts_and_bad_parts(app: App) -> None:
    good = {"model": MODEL, "max_tokens": 3, "temperature": 0}
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "tree"}]
    status, answer = post(
        app,
        "/v1/chat/completions",
        json.dumps({**good, "messages": [{"role": "user", "content": parts}]}).encode(),
    )
    plain = client(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello tree"}], max_tokens=3,
        temperature=0,
    )  # fmt: skip
    assert status == 200
    choices = answer["choices"]
    assert isinstance(choices, list) and choices[0]["message"]["content"] == (
        plain.choices[0].message.content
    )
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    status, answer = post(
        app,
        "/v1/chat/completions",
        json.dumps({**good, "messages": [{"role": "user", "content": image}]}).encode(),
    )
    assert status == 400 and "only text content parts" in str(answer["error"])


def test_metrics_are_prometheus_text(app: App) -> None:
    with urllib.request.urlopen(app.url + "/metrics", timeout=10) as response:
        assert response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            assert line.split()[3] in ("counter", "gauge", "histogram")
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples["eagletree_requests_total"] >= 1
    buckets = [v for k, v in samples.items() if k.startswith("eagletree_acceptance_length_bucket")]
    assert (
        buckets == sorted(buckets) and buckets[-1] == samples["eagletree_acceptance_length_count"]
    )
    assert (
        samples["eagletree_kv_slots_used"] + samples["eagletree_kv_slots_free"]
        == (samples["eagletree_kv_slots_total"])
    )


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "stopped"),
    [
        (["END"], ["abc", "E", "N", "D tail"], ["abc", "", "", ""], True),
        (["END"], ["abE", "x"], ["ab", "Ex"], False),
        (["xy", "b"], ["a", "bxy"], ["a", ""], True),
        (["zz"], ["z"], ["z"], False),  # final: nothing is held back
    ],
)
def test_stop_strings_hold_back_a_possible_start_and_cut_at_the_first(
    stops: list[str], pieces: list[str], emitted: list[str], stopped: bool
) -> None:
    filter_ = StopStrings(stops)
    out = [filter_.push(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert out == emitted
    assert filter_.stopped is stopped
