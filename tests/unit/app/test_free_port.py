"""free_port: a port nothing listens on, chosen where no outgoing connection can be given it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eagletree.app.parallel import process_group
from eagletree.app.parallel.process_group import ephemeral_port_range, free_port


def listens(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        return True


def test_a_free_port_lies_below_the_kernels_ephemeral_range_and_can_be_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    monkeypatch.setattr(process_group, "EPHEMERAL_RANGE_FILE", str(range_file))
    assert ephemeral_port_range() == (32768, 60999)
    ports = {free_port() for _ in range(20)}
    assert all(10_000 <= port < 32768 for port in ports)
    assert len(ports) > 1  # drawn, not one fixed port every caller would race for
    assert all(listens(port) for port in ports)


def test_without_a_known_range_any_port_the_kernel_hands_out_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_group, "EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))
    assert ephemeral_port_range() == (0, 0)
    port = free_port()
    assert 0 < port < 65536 and listens(port)
