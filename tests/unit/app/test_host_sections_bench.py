"""benchmarks/host_sections.py on the CPU: per engine the host time of each timed section of
the loop, the policy's only where a policy chooses, and the wrapped methods restored after."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import host_sections
from eagletree.app.engine.loop import Engine


def test_each_engine_gets_the_host_time_of_each_section(
    tmp_path: Path, tiny_eagle_pair: tuple[Path, Path]
) -> None:
    target, draft = tiny_eagle_pair
    step = Engine.step
    out = tmp_path / "host_sections.md"
    engines = ["plain", "adaptive:plain/chain:S2"]
    host_sections.main([
        "--target", str(target), "--draft-dir", str(draft), "--algorithm", "eagle",
        "--engines", *engines, "--batch-size", "3", "--prompt-len", "4", "--warmup", "2",
        "--steps", "5", "--out", str(out),
    ])  # fmt: skip
    assert Engine.step is step  # the wrappers are gone
    text = out.read_text()
    assert text.startswith("### host time per decode step by section (bs 3, T 1.0, 5 steps)")
    header = re.search(r"^\| section \| (.+) \|$", text, re.M)
    assert header is not None and header.group(1) == " | ".join(f"{e} µs" for e in engines)
    rows = {
        label: [float(v) for v in values.split(" | ")]
        for label, values in re.findall(r"^\| ([^|]+?) \| ([\d. |]+) \|$", text, re.M)
    }
    for column in range(len(engines)):

        def at(label: str, column: int = column) -> float:
            return rows[label][column]

        # nested sections within the ones around them, the loop's own time what is left
        assert 0 < at("device step function") <= at("step runner") <= at("worker step")
        assert at("worker step") + at("schedule") <= at("engine step")
        assert at("host: the step less the device's") == pytest.approx(
            at("engine step") - at("device step function") - at("wait for the tokens"), abs=0.2
        )
        assert at("host: the step less the device's") > 0
    # only the adaptive engine has a policy to choose and to learn
    assert rows["policy: choose"][0] == 0 and rows["policy: choose"][1] > 0
    assert rows["policy: learn"][0] == 0 and rows["policy: learn"][1] > 0


def test_a_batch_that_thins_within_the_timed_steps_is_refused(
    tiny_eagle_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests given 8 tokens, 2 steps of warm-up and 12 timed: the batch empties while timed
    target, draft = tiny_eagle_pair
    monkeypatch.setattr(host_sections, "most_tokens_per_step", lambda engine: 0)
    with pytest.raises(RuntimeError, match=r"plain: [0-2] of 3 requests still decoding"):
        host_sections.main([
            "--target", str(target), "--draft-dir", str(draft), "--algorithm", "eagle",
            "--engines", "plain", "--batch-size", "3", "--prompt-len", "4", "--warmup", "2",
            "--steps", "12",
        ])  # fmt: skip
