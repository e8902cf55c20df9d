"""A running `eagletree serve` on 127.0.0.1 with the embedded default model, for the module.

The server is a subprocess of the real command on a free local port; every wait is bounded
and the process is stopped (SIGTERM, then SIGKILL) when the tests are done.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagletree import Engine
from eagletree.app.composition.container import build_engine
from eagletree.app.composition.run_settings import load_settings, settings_for_run
from eagletree.app.parallel.process_group import free_port

# The serve extra and the openai client are absent on the GPU machine: collect nothing there.
if any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn", "openai")):
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 180.0
# Small pools keep the CPU run quick; the test process builds its reference engine the same way.
SERVER_ENV = {
    "EAGLETREE_MEMORY__MAX_TOTAL_TOKENS": "8192",
    "EAGLETREE_MEMORY__MAX_RUNNING_REQUESTS": "16",
    "EAGLETREE_MODEL__MAX_CONTEXT_LEN": "256",
}


@dataclass(frozen=True)
class Server:
    base_url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, timeout_s: float = 10.0) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=timeout_s) as response:
            body: bytes = response.read()
        return body.decode()

    def metrics(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for line in self.get("/metrics").splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_for(self, condition: str, check: object, timeout_s: float = 60.0) -> dict[str, float]:
        """Poll /metrics until ``check(metrics)`` holds; fail naming ``condition``."""
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.metrics()
            if check(metrics):  # type: ignore[operator]
                return metrics
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {condition}; metrics {metrics}")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def server_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-cache")


@pytest.fixture(scope="session")
def server(server_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLETREE_")}
    env.update(SERVER_ENV, XDG_CACHE_HOME=str(server_cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "eagletree.app.cli.main", "serve", "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)
    handle = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_healthy(handle)
        yield handle
    finally:
        _stop(process)


def _wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"eagletree serve exited: {server.log.read_text()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if '"ok"' in server.get("/health", timeout_s=2.0):
                return
        time.sleep(0.5)
    pytest.fail(f"eagletree serve did not become healthy: {server.log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def server_engine(server_cache: Path) -> Engine:
    """An engine built, in this process, from the settings the server's environment gives."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
            patch.delenv(name)
        for name, value in SERVER_ENV.items():
            patch.setenv(name, value)
        patch.setenv("XDG_CACHE_HOME", str(server_cache))
        return build_engine(settings_for_run(load_settings(None), lambda _: None))


@pytest.fixture
def engines(server_cache: Path) -> Iterator[tuple[Engine, Engine]]:
    """Two engines built alike: rank 0's (a leader, replica 0) and a follower's (replica 1)."""
    leader, follower = server_engine(server_cache), server_engine(server_cache)
    yield leader, follower
    leader.close()
    follower.close()


@pytest.fixture(scope="session")
def reference_engine(server_cache: Path) -> Iterator[Engine]:
    """An engine built from the same settings as the server, in this process."""
    with server_engine(server_cache) as engine:
        yield engine
