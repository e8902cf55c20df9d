"""``eagletree serve --tp 2`` spawns its ranks (gloo, the CPU, a tiny fp32 speculative pair):
its greedy completions equal the single-process engine's; SIGTERM to the launcher stops the
group and leaves no process behind; a rank that dies ends the group with an error naming it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer
from eagletree.app.parallel.process_group import free_port
from tests.integration.parallel.test_launch import settings_env
from tests.integration.parallel.test_tensor_parallel import SIZES
from tests.integration.spec.harness import WEIGHT_STD

if any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn")):
    pytest.skip("the serve extra is not installed", allow_module_level=True)

# served groups of 2 and 4 processes, 50 s in all: the slow lane (README)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 15.0  # ten tokens take well under a second; ranks out of step hang
MODEL = "tiny"
PROMPTS = ([5, 17, 3], [60, 2, 9, 41, 8], [11, 12])
MAX_TOKENS = 10
VOCAB_SIZE = 320  # a byte-level tokenizer's least, and some merges
RANK_PID = re.compile(r"rank (\d+) of 2: pid (\d+)")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    target, draft = write_random_checkpoint(
        tmp_path_factory.mktemp("serve-tp"),
        "llama",
        "eagle",
        sizes=dataclasses.replace(SIZES, vocab_size=VOCAB_SIZE),
        dtype=torch.float32,
        std=WEIGHT_STD,
    )
    assert draft is not None
    write_byte_level_tokenizer(target, VOCAB_SIZE)  # text answers, compared between servers
    return target, draft


class Launch:
    """``eagletree serve`` as a subprocess on a free port, its stderr in a file."""

    def __init__(
        self,
        checkpoints: tuple[Path, Path],
        log: Path,
        *flags: str,
        torchrun: bool = False,
        nproc: int = 2,
    ) -> None:
        self.port = free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLETREE_")}
        env.update(settings_env(*checkpoints), PYTHONPATH=str(ROOT))
        command = [
            sys.executable,
            "-m",
            "eagletree.app.cli.main",
            "serve",
            "--port",
            str(self.port),
        ]
        command += ["--served-model-name", MODEL]
        if torchrun:  # torchrun starts the ranks; each joins its group
            launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
            launcher += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
            command[1:1] = launcher
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [*command, *flags], cwd=ROOT, env=env, stdout=sink, stderr=sink
            )

    def text(self) -> str:
        return self.log.read_text()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"eagletree serve exited: {self.text()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                url = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=2.0) as response:
                    if b'"ok"' in response.read():
                        return
            time.sleep(0.3)
        pytest.fail(f"eagletree serve did not become healthy: {self.text()}")

    def completion(self, prompt: list[int], temperature: float = 0.0) -> dict[str, object]:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": temperature,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
                answer: dict[str, object] = json.loads(response.read())
        except (OSError, urllib.error.URLError) as error:
            pytest.fail(f"no completion for {prompt} ({error}); the server's log:\n{self.text()}")
        return answer

    def rank_pids(self) -> dict[int, int]:
        """Both ranks' pids from the log: a follower may print its line after rank 0 is healthy
        (it does right before stepping), so wait for it a while."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            pids = {int(rank): int(pid) for rank, pid in RANK_PID.findall(self.text())}
            if len(pids) == 2 or time.monotonic() >= deadline or self.process.poll() is not None:
                return pids
            time.sleep(0.1)

    def wait_exit(self) -> int:
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"eagletree serve did not exit in {EXIT_TIMEOUT_S} s: {self.text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for pid in self.rank_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def launch(checkpoints: tuple[Path, Path], tmp_path: Path) -> Iterator[Callable[..., Launch]]:
    """Start servers; whatever the test leaves running is killed, ranks included."""
    started: list[Launch] = []

    def start(*flags: str, torchrun: bool = False, nproc: int = 2) -> Launch:
        log = tmp_path / f"serve-{len(started)}.log"
        handle = Launch(checkpoints, log, *flags, torchrun=torchrun, nproc=nproc)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.kill()


@pytest.fixture(scope="module")
def expected(
    checkpoints: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[str, int]]:
    """What a single-process server answers."""
    single = Launch(checkpoints, tmp_path_factory.mktemp("serve-single") / "serve.log")
    try:
        single.wait_healthy()
        answers = complete_all(single)
        single.process.send_signal(signal.SIGINT)
        assert single.wait_exit() == 0, single.text()
    finally:
        single.kill()
    assert all(tokens == MAX_TOKENS for _, tokens in answers), answers
    assert len({text for text, _ in answers}) == len(PROMPTS), answers  # not one constant
    return answers


def gone(pids: dict[int, int]) -> list[int]:
    """The ``pids`` still alive after a few seconds (none, as it should be)."""
    deadline = time.monotonic() + 10.0
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids.values() if alive(pid)]


def complete_all(server: Launch) -> list[tuple[str, int]]:
    """The greedy completions of ``PROMPTS``, sent at once (so that they share steps)."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(server.completion, PROMPTS))
    results = []
    for answer in answers:
        choice = answer["choices"][0]  # type: ignore[index]
        results.append((choice["text"], answer["usage"]["completion_tokens"]))  # type: ignore[index]
    return results


def test_serve_with_tp_2_answers_as_one_process_and_stops_cleanly(
    launch: Callable[..., Launch], expected: list[tuple[str, int]]
) -> None:
    parallel = launch("--tp", "2")
    parallel.wait_healthy()
    assert complete_all(parallel) == expected
    assert complete_all(parallel) == expected  # the ranks still agree on later steps
    # unseeded sampling: ranks drawing seeds of their own would diverge (and hang or fail)
    with ThreadPoolExecutor(2) as pool:
        sampled = list(pool.map(lambda p: parallel.completion(p, 1.0), PROMPTS[:2]))
    for answer in sampled:  # a sampled eos may end one early
        assert 1 <= answer["usage"]["completion_tokens"] <= MAX_TOKENS  # type: ignore[index]
    pids = parallel.rank_pids()
    assert sorted(pids) == [0, 1], parallel.text()
    parallel.process.send_signal(signal.SIGTERM)  # the launcher hands it on to rank 0
    assert parallel.wait_exit() == 0, parallel.text()
    assert gone(pids) == [], parallel.text()
    assert "error:" not in parallel.text(), parallel.text()


def test_serve_under_torchrun_answers_as_one_process_and_rank_0_stops_the_group(
    launch: Callable[..., Launch], expected: list[tuple[str, int]]
) -> None:
    parallel = launch("--tp", "2", torchrun=True)
    parallel.wait_healthy()
    assert complete_all(parallel) == expected
    pids = parallel.rank_pids()
    assert sorted(pids) == [0, 1], parallel.text()
    os.kill(pids[0], signal.SIGINT)
    assert parallel.wait_exit() == 0, parallel.text()
    assert gone(pids) == [], parallel.text()


@pytest.mark.parametrize("torchrun", [False, True], ids=["spawned", "torchrun"])
def test_a_rank_that_dies_ends_the_served_group_naming_it(
    launch: Callable[..., Launch], torchrun: bool
) -> None:
    parallel = launch("--tp", "2", torchrun=torchrun)
    parallel.wait_healthy()
    pids = parallel.rank_pids()
    os.kill(pids[1], signal.SIGKILL)
    assert parallel.wait_exit() == 1, parallel.text()
    # rank 0's next broadcast fails and it stops serving; the launcher names the dead rank
    named = "rank      : 1 (local_rank: 1)" if torchrun else "rank 1 of 2 failed first"
    assert named in parallel.text(), parallel.text()
    assert gone(pids) == [], parallel.text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for good, only not reaped yet
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
