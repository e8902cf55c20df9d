"""benchmarks/sampling_kernels.py runs its smoke shapes: a row per case of each table, with the
reference's and the kernel's times."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import sampling_kernels
from tests.conftest import requires_triton


def test_the_smoke_run_times_every_case_both_ways(tmp_path: Path) -> None:
    requires_triton("cpu")
    out = tmp_path / "sampling_kernels.md"
    assert sampling_kernels.main(["--smoke", "--device", "cpu", "--out", str(out)]) == 0
    text = out.read_text()
    assert re.findall(r"^## (.+)$", text, re.M) == [
        "Draws, vocabulary 50",
        "Tempered softmax, vocabulary 50",
        "A drawn chain S3's walk, vocabulary 50",
    ]
    rows = re.findall(
        r"^\| (bs \d+, (?:k \d+|block \d+, \w+ walk)|\d+ rows)"
        r" \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \|$",
        text,
        re.M,
    )
    assert [name for name, _, _ in rows] == [
        "bs 1, k 1", "bs 2, k 4", "1 rows", "3 rows", "bs 2, block 16, tree walk",
        "bs 2, block 16, chain walk",
    ]  # fmt: skip
    assert all(float(a) > 0 and float(b) > 0 for _, a, b in rows)
