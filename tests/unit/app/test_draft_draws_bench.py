"""benchmarks/draft_draws.py on the CPU, at a few seconds' training: a row per head and
temperature with a rate per unrolled depth for argmax and drawn drafts, and the engine's tokens
per verify step of each chain and tree either way; the trained models are kept for the next
run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import draft_draws


@pytest.mark.hf
def test_each_head_and_temperature_gets_depth_rates_and_engine_chains(tmp_path: Path) -> None:
    out = tmp_path / "draft_draws.md"
    args = [
        "--dir", str(tmp_path / "pair"), "--corpus-mb", "0.05", "--target-minutes", "0.01",
        "--head-minutes", "0.01", "--temperatures", "1", "--labels", "hard", "soft",
        "--prompts", "2", "--new-tokens", "6", "--out", str(out),
    ]  # fmt: skip
    assert draft_draws.main(args) == 0
    rows = re.findall(r"^\| (hard|soft) \| 1\.0 \| ([\d. ]+) \| ([\d. ]+) \| (.+) \|$",
                      out.read_text(), re.M)  # fmt: skip
    assert [row[0] for row in rows] == ["hard", "soft"]
    for _, argmax, drawn, engine in rows:
        for rates in (argmax, drawn):
            values = [float(v) for v in rates.split()]
            assert len(values) == draft_draws.DEPTHS and all(0 <= v <= 1 for v in values)
        cells = engine.split(" | ")
        assert len(cells) == len(draft_draws.SHAPES)
        for cell, shape in zip(cells, draft_draws.SHAPES, strict=True):
            tokens = [float(v) for v in cell.split(" / ")]
            assert len(tokens) == 2 and all(1 <= t <= shape.num_steps + 1 for t in tokens)
    # the models are kept for the next run (a head with its trainer's state)
    saved = sorted(p.name for p in (tmp_path / "pair").iterdir())
    assert saved == ["corpus.txt", "head-hard", "head-soft", "target"]
    assert all(
        (tmp_path / "pair" / f"head-{labels}" / "state").exists() for labels in ("hard", "soft")
    )
