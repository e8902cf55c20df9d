"""``eagletree serve --dp 2`` spawns two data-parallel replicas (gloo, the CPU, a tiny fp32
speculative pair): rank 0 places concurrent requests on both replicas (its /metrics count
them), streamed and whole greedy completions equal the single-process engine's, a client that
goes away mid-stream has its request aborted on the replica that runs it, SIGTERM stops the
group leaving no rank behind, and a rank that dies ends the group with an error naming it."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eagletree.app.composition.container import build_engine
from eagletree.app.composition.run_settings import load_settings, settings_for_run
from tests.integration.parallel.test_launch import settings_env
from tests.integration.parallel.test_serve_tp import (
    MAX_TOKENS,
    MODEL,
    PROMPTS,
    Launch,
    checkpoints,
    gone,
    launch,
)

# the fixtures imported above, re-exported so that pytest (and ruff) see them used by name
__all__ = ["checkpoints", "launch"]

# served groups of 2 and 4 processes, 40 s in all: the slow lane (README)
pytestmark = pytest.mark.slow

STREAMED = [7, 30, 2, 19]
ABORTED = [90, 91, 92]  # asks for far more tokens than it is given the time to make
METRIC_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def reference(checkpoints: tuple[Path, Path]) -> dict[tuple[int, ...], tuple[str, int]]:
    """Text and token count of each greedy prompt, from one engine in this process built from
    the settings the server reads."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
            patch.delenv(name)
        for name, value in settings_env(*checkpoints).items():
            patch.setenv(name, value)
        settings = settings_for_run(load_settings(None), lambda _: None)
    prompts = [*PROMPTS, STREAMED]
    with build_engine(settings) as engine:
        results = engine.generate(prompts, max_new_tokens=MAX_TOKENS)
    answers = {}
    for prompt, result in zip(prompts, results, strict=True):
        assert result.text is not None
        answers[tuple(prompt)] = (result.text, len(result.output_ids))
    assert len({text for text, _ in answers.values()}) == len(prompts), answers
    return answers


def stream(server: Launch, prompt: list[int], max_tokens: int, chunks: int | None = None) -> str:
    """A streamed completion's text; with ``chunks``, the client hangs up after that many."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    body["stream"] = True
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    text, seen = "", 0
    try:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text += json.loads(line[len("data: ") :])["choices"][0]["text"]
            seen += 1
            if chunks is not None and seen >= chunks:
                break
    finally:
        connection.close()
    return text


def metric(server: Launch, name: str, least: float) -> float:
    """The value of /metrics line ``name`` once it is at least ``least`` (bounded wait)."""
    deadline = time.monotonic() + METRIC_TIMEOUT_S
    value = 0.0
    while time.monotonic() < deadline:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            lines = response.read().decode().splitlines()
        values = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
        value = float(values.get(name, 0.0))
        if value >= least:
            return value
        time.sleep(0.2)
    pytest.fail(f"{name} stayed at {value} < {least}; the server's log:\n{server.text()}")


@pytest.mark.parametrize(
    ("flags", "torchrun"),
    [(("--dp", "2"), False), (("--tp", "2", "--dp", "2"), True)],
    ids=["dp2-spawned", "tp2-dp2-torchrun"],
)
def test_serve_with_dp_2_spreads_requests_and_answers_as_one_engine(
    launch: Callable[..., Launch],
    reference: dict[tuple[int, ...], tuple[str, int]],
    flags: tuple[str, ...],
    torchrun: bool,
) -> None:
    world_size = 4 if "--tp" in flags else 2
    server = launch(*flags, torchrun=torchrun, nproc=world_size)
    server.wait_healthy()
    with ThreadPoolExecutor(len(PROMPTS) + 2) as pool:
        # the aborted request first: it holds its replica for its whole (long) budget
        aborted = pool.submit(stream, server, ABORTED, 60, 1)
        whole = [pool.submit(server.completion, prompt) for prompt in PROMPTS]
        streamed = pool.submit(stream, server, STREAMED, MAX_TOKENS)
        answers = [future.result(timeout=60) for future in whole]
        streamed_text = streamed.result(timeout=60)
        aborted.result(timeout=60)
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        choice = answer["choices"][0]  # type: ignore[index]
        tokens = answer["usage"]["completion_tokens"]  # type: ignore[index]
        assert (choice["text"], tokens) == reference[tuple(prompt)]
    assert streamed_text == reference[tuple(STREAMED)][0]
    # every request placed, on both replicas; the one whose client left was aborted
    assert metric(server, 'eagletree_replica_requests_total{replica="0"}', 1) >= 1
    assert metric(server, 'eagletree_replica_requests_total{replica="1"}', 1) >= 1
    assert metric(server, "eagletree_requests_total", len(PROMPTS) + 2) == len(PROMPTS) + 2
    assert metric(server, 'eagletree_requests_finished_total{reason="abort"}', 1) == 1
    assert server.completion(PROMPTS[0])["choices"][0]["text"] == reference[tuple(PROMPTS[0])][0]  # type: ignore[index]
    found = re.findall(rf"rank (\d+) of {world_size}: pid (\d+)", server.text())
    pids = {int(rank): int(pid) for rank, pid in found}
    assert sorted(pids) == list(range(world_size)), server.text()
    if torchrun:  # torchrun's ranks stop when rank 0 does
        os.kill(pids[0], signal.SIGINT)
    else:  # the spawning launcher hands it on to rank 0
        server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.text()
    assert gone(pids) == [], server.text()
    assert "error:" not in server.text(), server.text()


def test_a_replica_that_dies_ends_the_served_group_naming_it(
    launch: Callable[..., Launch],
) -> None:
    server = launch("--dp", "2")
    server.wait_healthy()
    pids = server.rank_pids()
    os.kill(pids[1], signal.SIGKILL)
    assert server.wait_exit() == 1, server.text()
    assert "rank 1 of 2 failed first" in server.text(), server.text()
    assert gone(pids) == [], server.text()
