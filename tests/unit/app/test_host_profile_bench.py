"""benchmarks/host_profile.py on the CPU: a section per engine — fixed, adaptive without plain,
plain — with its steps, its time per step, and the functions of the engine's loop that took the
most host time, the engine's own and torch's."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import host_profile


def test_each_engine_gets_its_steps_and_its_costliest_host_functions(
    tmp_path: Path, tiny_eagle_pair: tuple[Path, Path]
) -> None:
    target, draft = tiny_eagle_pair
    out = tmp_path / "host_profile.md"
    engines = ["chain:S2", "adaptive:chain:S2/tree:S2,k2,N4", "plain"]
    host_profile.main([
        "--target", str(target), "--draft-dir", str(draft), "--algorithm", "eagle",
        "--engines", *engines, "--batch-size", "3", "--prompt-len", "4", "--new-tokens", "6",
        "--top", "50", "--out", str(out),
    ])  # fmt: skip
    text = out.read_text()
    heads = re.findall(
        r"^### (\S+) \(bs 3, T 0\.0\): (\d+) steps, ([\d.]+) ms a step under the profiler, "
        r"([\d.]+) µs of it waiting for the device$",
        text,
        re.M,
    )
    assert [engine for engine, *_ in heads] == engines
    # a prefill and at least one decode step each; six tokens take at most six steps after it
    assert all(2 <= int(steps) <= 7 and float(ms) > 0 for _, steps, ms, _ in heads)
    # on the CPU every operator runs before it returns: the loop never waits for a device
    assert [float(waited) for *_, waited in heads] == [0.0] * len(engines)
    sections = text.split("### ")[1:]
    for section in sections:
        rows = re.findall(r"^\| `(.+)` \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", section, re.M)
        assert len(rows) == 50
        own = [float(r[2]) for r in rows]
        assert own == sorted(own, reverse=True)  # the costliest first
        assert all(float(total) >= float(o) for _, _, o, total in rows)
        # the engine's own functions are there by file and line, beside torch's built-ins
        assert any(re.fullmatch(r"\w+\.py:\d+ \w+", name) for name, *_ in rows)
        assert any(name.startswith("<built-in method torch.") for name, *_ in rows)
