"""benchmarks/policy_host.py on the CPU: a row per batch size, each cell the choice and the
read-back as the engine drives them, and their sum."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import policy_host


def test_each_batch_size_gets_the_choice_and_the_read_back(tmp_path: Path) -> None:
    out = tmp_path / "policy_host.md"
    policy_host.main(["--steps", "20", "--repeats", "1", "--out", str(out)])
    cells = re.findall(r"^\| (\d+) \| (.+) \| (.+) \|$", out.read_text(), re.M)
    assert [int(size) for size, *_ in cells] == list(policy_host.BATCH_SIZES)
    for _, *temperatures in cells:
        for cell in temperatures:
            chose, read, total = (float(v) for v in re.split(r" [+=] ", cell))
            assert chose > 0 and read > 0  # every step chose, every one after the first read
            assert total == pytest.approx(chose + read, abs=0.11)  # rounded to 0.1 each
