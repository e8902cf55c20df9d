"""/metrics as Prometheus reads it: the acceptance histogram keeps one fixed set of buckets
whatever it has counted, and the request-row gauge counts the rows a request can get."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from eagletree.app.engine.streaming import StreamEvent
from eagletree.app.server.engine_loop import EngineLoop
from eagletree.app.server.metrics import ServerMetrics
from eagletree.app.server.openai_api import create_app
from eagletree.domain.sampling import SamplingParams
from tests.hypothesis_profiles import examples
from tests.integration.server.conftest import server_engine

HISTOGRAM = "eagletree_acceptance_length"


def samples(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@given(st.dictionaries(st.integers(0, 40), st.integers(0, 1000)))
@settings(max_examples=examples(100))
def test_the_acceptance_histogram_has_the_same_buckets_whatever_it_counted(
    counts: dict[int, int],
) -> None:
    metrics = ServerMetrics()
    empty = samples(metrics.render())
    metrics.acceptance = Counter(counts)
    counted = samples(metrics.render())
    buckets = [name for name in counted if name.startswith(f"{HISTOGRAM}_bucket")]
    assert buckets == [name for name in empty if name.startswith(f"{HISTOGRAM}_bucket")]
    assert buckets[-1] == f'{HISTOGRAM}_bucket{{le="+Inf"}}'
    for name in buckets[:-1]:  # cumulative: the steps that emitted at most ``le`` tokens
        bound = int(name.split('"')[1])
        assert counted[name] == sum(n for tokens, n in counts.items() if tokens <= bound)
    assert counted[buckets[-1]] == counted[f"{HISTOGRAM}_count"] == sum(counts.values())
    assert counted[f"{HISTOGRAM}_sum"] == sum(tokens * n for tokens, n in counts.items())
    # per-depth acceptance: of the steps that accepted d − 1 drafts, those that accepted a d-th
    depths = [name for name in counted if name.startswith("eagletree_acceptance_at_depth")]
    assert depths == [f'eagletree_acceptance_at_depth{{depth="{d}"}}' for d in range(1, 16)]
    for d in range(1, 16):
        reached = sum(n for tokens, n in counts.items() if tokens >= d)
        value = counted[f'eagletree_acceptance_at_depth{{depth="{d}"}}']
        if reached == 0:
            assert math.isnan(value)
        else:
            assert value == sum(n for tokens, n in counts.items() if tokens > d) / reached


@pytest.fixture(scope="module")
def loop(server_cache: Path) -> Iterator[EngineLoop]:
    loop = EngineLoop(server_engine(server_cache))
    loop.start()
    yield loop
    loop.stop()


def test_the_free_request_rows_are_the_rows_a_request_can_get(loop: EngineLoop) -> None:
    """Idle, every request may get a row (the pool holds one more, for padding CUDA-graph
    batches); while one request runs, one fewer. Each step's gauges are published before its
    events reach their sinks."""
    limit = loop.engine.scheduler.max_running_requests
    client = TestClient(create_app(loop, "tiny"))
    assert samples(client.get("/metrics").text)["eagletree_request_rows_free"] == limit
    seen: list[tuple[bool, int]] = []
    done = threading.Event()

    def sink(event: StreamEvent | BaseException) -> None:
        assert isinstance(event, StreamEvent), event
        seen.append((event.finished, loop.metrics.rows_free))
        if event.finished:
            done.set()

    loop.submit([1, 5, 9], SamplingParams(max_new_tokens=6), sink).result(timeout=20)
    assert done.wait(timeout=60)
    assert len(seen) >= 2  # a step with the request running, and its last
    assert [free for finished, free in seen if not finished] == [limit - 1] * (len(seen) - 1)
    assert samples(client.get("/metrics").text)["eagletree_request_rows_free"] == limit


def test_the_steps_of_each_draft_shape_are_counted(loop: EngineLoop) -> None:
    client = TestClient(create_app(loop, "tiny"))
    before = samples(client.get("/metrics").text)
    done = threading.Event()

    def sink(event: StreamEvent | BaseException) -> None:
        assert isinstance(event, StreamEvent), event
        if event.finished:
            done.set()

    loop.submit([2, 7, 3], SamplingParams(max_new_tokens=8), sink).result(timeout=20)
    assert done.wait(timeout=60)
    after = samples(client.get("/metrics").text)
    shapes = [name for name in after if name.startswith("eagletree_draft_shape_steps_total")]
    label = loop.engine.worker.shape.label  # type: ignore[attr-defined]  # a speculative worker
    assert shapes == [f'eagletree_draft_shape_steps_total{{shape="{label}"}}']
    steps = after[shapes[0]] - before.get(shapes[0], 0.0)
    assert 1 <= steps <= 7  # one prefill, then at most one decode step per token
