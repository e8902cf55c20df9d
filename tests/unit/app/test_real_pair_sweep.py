"""The sweep's variants: parsed into train-draft options, with errors that name the problem; its
report, a row per variant."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.real_pair.sweep import DEFAULT_VARIANTS, parse_variant, write_report
from eagletree.app.training.options import TrainOptions


def test_a_variant_changes_only_the_fields_it_names() -> None:
    base = TrainOptions(Path("t"), "eagle3", (Path("d"),), Path("o"))
    variant = parse_variant("eagle3:labels=soft,lr=3e-3,batch=16,unroll=6")
    options = variant.apply(base)
    assert variant.algorithm == "eagle3"
    assert (options.loss.labels, options.lr, options.batch_size, options.unroll_steps) == (
        "soft", 3e-3, 16, 6,
    )  # fmt: skip
    assert options.loss.regression == base.loss.regression and options.seed == base.seed
    assert parse_variant("eagle:regression=1.0").apply(base).loss.regression == 1.0
    assert parse_variant("eagle").apply(base) == base
    both = parse_variant("eagle3:norm=target,lm_head=frozen").apply(base)
    assert (both.eagle3_norm, both.eagle3_lm_head) == ("target", "frozen")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("medusa:lr=1", "the algorithm must be eagle or eagle3"),
        ("eagle3:learning_rate=1e-3", "'learning_rate=1e-3' is not FIELD=VALUE"),
        ("eagle3:lr", "'lr' is not FIELD=VALUE"),
        ("eagle3:lr=fast", "lr='fast'"),
        ("eagle3:labels=sof", "expected one of hard, soft, mixed"),
        ("eagle3:norm=half", "norm='half': expected one of ones, target"),
        ("eagle3:lm_head=tied", "lm_head='tied': expected one of trained, frozen"),
    ],
)
def test_a_bad_variant_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_variant(text)


def test_the_default_variants_parse_and_fit_one_gpu_call() -> None:
    variants = [parse_variant(text) for text in DEFAULT_VARIANTS]
    assert len({v.name for v in variants}) == len(variants)
    # 0.5 min each plus about 3 min to train a missing target must stay within 9 minutes
    assert 0.5 * len(variants) + 3 <= 9


def test_the_report_shows_each_variants_agreement_t1_rates_drawn_rates_and_chains(
    tmp_path: Path,
) -> None:
    args = argparse.Namespace(minutes=2.0, depths=[3, 5])
    result = {
        "variant": "eagle3:norm=target",
        "steps": 900,
        "agreement_by_step": [0.7, 0.69],
        "sampled_rank0_by_depth": [0.48, 0.54],
        "sampled_top4_by_depth": [0.81, 0.86],
        "drawn_by_depth": [0.66, 0.71],
        "chain_tokens_per_step": {3: 3.15, 5: 4.02},
    }
    write_report(tmp_path, args, [result])
    table = (tmp_path / "sweep.md").read_text()
    header = "| variant | steps | agreement by step | T 1 | T 1 top 4 | T 1 drawn | chain S3 |"
    assert header in table
    row = (
        "| eagle3:norm=target | 900 | 0.70 0.69 | 0.48 0.54 | 0.81 0.86 | 0.66 0.71 | 3.15 | 4.02 |"
    )
    assert row in table
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["variants"][0]["sampled_rank0_by_depth"] == [0.48, 0.54]
