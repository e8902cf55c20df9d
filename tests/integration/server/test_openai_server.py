"""`eagletree serve` driven by the official openai client: completions and chat, streamed and
not, concurrent clients sharing engine steps, disconnects that free their slots, 400s."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from eagletree import Engine
from tests.integration.server.conftest import Server

MODEL = "eagletree-default"
PROMPTS = ["The draft tree", "speculative decoding with a beam", "tokens", "a b c d e f"]
CLIENT_TIMEOUT_S = 60.0


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", timeout=CLIENT_TIMEOUT_S, max_retries=0
    )


def expected_texts(engine: Engine, prompts: list[str], max_tokens: int) -> list[str | None]:
    return [r.text for r in engine.generate(prompts, max_new_tokens=max_tokens)]


def test_health_and_models(server: Server) -> None:
    assert '"ok"' in server.get("/health")
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completions_equal_engine_generate_streamed_and_not(
    server: Server, reference_engine: Engine
) -> None:
    api = client(server)
    expected = expected_texts(reference_engine, PROMPTS, 12)
    for prompt, want in zip(PROMPTS, expected, strict=True):
        full = api.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        assert full.choices[0].text == want
        assert full.choices[0].finish_reason in ("length", "stop")
        assert full.usage is not None and full.usage.completion_tokens >= 1
        chunks = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        pieces = [chunk.choices[0].text for chunk in chunks]
        assert "".join(pieces) == want
    assert want is not None and len(expected) == len(PROMPTS)


def test_chat_equals_engine_generate_on_the_chat_template_streamed_and_not(
    server: Server, reference_engine: Engine
) -> None:
    api = client(server)
    tokenizer = reference_engine.tokenizer
    assert tokenizer is not None and tokenizer.has_chat_template
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello tree"}]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello tree"}])
    (want,) = reference_engine.generate([ids], max_new_tokens=10)
    full = api.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,
    )
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == want.text
    stream = api.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_sixteen_concurrent_clients_share_engine_steps(
    server: Server, reference_engine: Engine
) -> None:
    before = server.metrics()
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(16)]
    expected = expected_texts(reference_engine, prompts, 16)

    def complete(prompt: str) -> str:
        response = client(server).completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=0
        )
        return response.choices[0].text

    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(complete, prompts, timeout=120))
    assert texts == expected
    after = server.wait_for("idle", lambda m: m["eagletree_requests_running"] == 0)
    assert (
        after["eagletree_engine_batched_steps_total"]
        > before["eagletree_engine_batched_steps_total"]
    )
    assert after["eagletree_engine_step_max_batch"] >= 4
    assert after["eagletree_requests_total"] - before["eagletree_requests_total"] == 16


def test_a_client_that_disconnects_mid_stream_gives_its_slots_back(server: Server) -> None:
    start = server.wait_for("idle", lambda m: m["eagletree_requests_running"] == 0)
    free_at_start = start["eagletree_kv_slots_free"]
    stream = client(server).completions.create(
        model=MODEL, prompt="a long answer", max_tokens=200, temperature=0, stream=True
    )
    next(iter(stream))
    busy = server.metrics()
    assert busy["eagletree_kv_slots_free"] < free_at_start  # the request holds slots
    stream.close()
    after = server.wait_for(
        "the aborted request's slots",
        lambda m: (
            m["eagletree_kv_slots_free"] == free_at_start and m["eagletree_requests_running"] == 0
        ),
    )
    aborted = 'eagletree_requests_finished_total{reason="abort"}'
    assert after["eagletree_client_aborts_total"] == start["eagletree_client_aborts_total"] + 1
    assert after[aborted] == start.get(aborted, 0) + 1  # aborted, not run to its 200 tokens


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": [99999]}, "outside the vocabulary"),
        ({"prompt": "x", "model": "gpt-4"}, "is not served here"),
        ({"prompt": "x", "n": 2}, "only n = 1"),
        ({"prompt": "x", "temperature": 5}, "temperature"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 100000}, "exceeds this server's limit"),
        ({"prompt": "x", "logprobs": 2}, "logprobs are not supported"),
        ({"prompt": "x" * 2000}, "context holds"),
    ],
)
def test_bad_completion_requests_get_400_with_the_reason(
    server: Server, kwargs: dict[str, object], message: str
) -> None:
    arguments: dict[str, Any] = {"model": MODEL, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as raised:
        client(server).completions.create(**arguments)
    assert raised.value.status_code == 400
    assert message in str(raised.value)


def test_bad_chat_requests_get_400(server: Server) -> None:
    api = client(server)
    with pytest.raises(openai.BadRequestError, match="messages"):
        api.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="role"):
        api.chat.completions.create(
            model=MODEL,
            messages=[cast(ChatCompletionMessageParam, {"role": "wizard", "content": "x"})],
            max_tokens=4,
        )


def test_load_of_200_requests_from_16_clients_with_aborts_loses_nothing(server: Server) -> None:
    start = server.wait_for("idle", lambda m: m["eagletree_requests_running"] == 0)
    rng = random.Random(13)
    jobs = [
        (
            " ".join(rng.choice(PROMPTS) for _ in range(rng.randint(1, 4))),
            rng.randint(1, 24),
            rng.random() < 0.5,  # streamed
            rng.random() < 0.2,  # abandoned after the first chunk
        )
        for _ in range(200)
    ]

    def run(job: tuple[str, int, bool, bool]) -> str:
        prompt, max_tokens, streamed, abandon = job
        api = client(server)
        if not streamed:
            result = api.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0.7, seed=1
            )
            return str(result.choices[0].finish_reason)
        stream = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        finish = None
        for chunk in stream:
            if abandon:
                stream.close()
                return "cancelled"
            finish = chunk.choices[0].finish_reason or finish
        return str(finish)

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(run, jobs, timeout=300))
    assert all(o in ("length", "stop", "cancelled") for o in outcomes), outcomes
    assert outcomes.count("cancelled") == sum(j[2] and j[3] for j in jobs)
    after = server.wait_for(
        "every request finished and every slot free",
        lambda m: (
            m["eagletree_requests_running"] == 0
            and m["eagletree_requests_waiting"] == 0
            and m["eagletree_kv_slots_free"] == start["eagletree_kv_slots_free"]
        ),
    )
    finished = sum(v for k, v in after.items() if k.startswith("eagletree_requests_finished"))
    finished_before = sum(
        v for k, v in start.items() if k.startswith("eagletree_requests_finished")
    )
    assert after["eagletree_requests_total"] - start["eagletree_requests_total"] == 200
    assert finished - finished_before == 200
    assert after["eagletree_request_rows_free"] == start["eagletree_request_rows_free"]
    print(f"load test: 200 requests in {time.monotonic() - started:.1f} s")
