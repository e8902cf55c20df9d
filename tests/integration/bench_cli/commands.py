"""`eagletree bench` as its tests call it: the command's status and output, and the tiny preset's
flags on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagletree.app.cli import main as cli

TREE = "tree S2 k2 N3"


def bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(["bench", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def tiny_run(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--preset", "tiny", "--checkpoint-dir", str(tmp_path / "checkpoint"),
        "--device", "cpu", "--attention", "torch", "--kv-move", "torch",
        "--prompt-len", "8", "--new-tokens", "4", "--warmup-steps", "1", "--profile-steps", "1",
        *extra,
    ]  # fmt: skip
