"""benchmarks/sampled_kernels.py: a greedy and a sampled step's kernels side by side, the
largest difference first; on the CPU (no kernels to list) each engine still profiles both."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import sampled_kernels


def test_kernels_are_listed_by_what_sampling_adds_with_the_steps_totals() -> None:
    greedy = {"gemm": (10.0, 0.50), "argmax": (2.0, 0.02)}
    sampled = {"gemm": (10.0, 0.49), "softmax": (3.0, 0.06), "draw": (1.0, 0.03)}
    lines = sampled_kernels.report("chain S3", greedy, sampled, (0.9, 1.2), top=3)
    assert lines[0] == (
        "### chain S3: device ms a step greedy 0.520 / sampled 0.580 (12 / 14 launches; "
        "wall under the profiler 0.900 / 1.200 ms)"
    )
    rows = [line for line in lines if line.startswith("| `")]
    # softmax +0.06, draw +0.03, gemm −0.01 (argmax −0.02 past the top 3)
    assert [re.match(r"\| `(\w+)`", row).group(1) for row in rows] == ["softmax", "draw", "gemm"]  # type: ignore[union-attr]
    assert rows[0] == "| `softmax` | 0.0 / 3.0 | 0.0000 / 0.0600 | +0.0600 |"
    assert rows[2].endswith("| 0.5000 / 0.4900 | -0.0100 |")


def test_each_engine_profiles_a_greedy_and_a_sampled_step(
    tmp_path: Path, tiny_eagle_pair: tuple[Path, Path]
) -> None:
    target, draft = tiny_eagle_pair
    out = tmp_path / "sampled_kernels.md"
    sampled_kernels.main([
        "--target", str(target), "--draft-dir", str(draft), "--algorithm", "eagle",
        "--engines", "plain", "chain:S2", "--batch-size", "2", "--prompt-len", "4",
        "--warmup", "1", "--steps", "2", "--out", str(out),
    ])  # fmt: skip
    headers = re.findall(r"^### (\S+): device ms a step .* wall under the profiler "
                         r"([\d.]+) / ([\d.]+) ms\)$", out.read_text(), re.M)  # fmt: skip
    assert [engine for engine, _, _ in headers] == ["plain", "chain:S2"]
    assert all(float(g) > 0 and float(s) > 0 for _, g, s in headers)
