"""The rank profiles a head's training report hands the adaptive policy: read as written, none
where the head has no report or the report no profile, and a malformed one refused with the
file's name and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagletree.adapters.models.head_report import read_rank_priors


def _write(directory: Path, report: object) -> Path:
    (directory / "training.json").write_text(json.dumps(report))
    return directory


def test_the_profiles_are_read_per_class_as_written(tmp_path: Path) -> None:
    greedy, sampled = [[0.7, 0.2], [0.6]], [[0.3, 0.1, 0.05]]
    head = _write(tmp_path, {"steps": 3, "rank_profile": {"greedy": greedy, "sampled": sampled}})
    priors = read_rank_priors(head)
    assert priors["greedy"].hit_rates == ((0.7, 0.2), (0.6,))
    assert priors["sampled"].hit_rates == ((0.3, 0.1, 0.05),)
    assert "drawn" not in priors  # a report from before drawn chains were measured


def test_a_measured_drawn_chain_profile_is_read_too(tmp_path: Path) -> None:
    profiles = {"greedy": [[0.7]], "sampled": [[0.3]], "drawn": [[0.55], [0.6]]}
    priors = read_rank_priors(_write(tmp_path, {"rank_profile": profiles}))
    assert priors["drawn"].hit_rates == ((0.55,), (0.6,))


def test_no_head_no_report_or_no_profile_is_no_prior(tmp_path: Path) -> None:
    assert read_rank_priors(None) == {}
    assert read_rank_priors(tmp_path) == {}
    assert read_rank_priors(_write(tmp_path, {"steps": 3})) == {}


@pytest.mark.parametrize(
    ("report", "names"),
    [
        ({"rank_profile": {"greedy": [[0.7, 0.5]], "sampled": [[0.1]]}}, "rank_profile.greedy"),
        ({"rank_profile": {"greedy": [[0.7]]}}, "rank_profile.sampled"),
        ({"rank_profile": {"greedy": [[0.7]], "sampled": [["x"]]}}, "rank_profile.sampled"),
        ({"rank_profile": {"greedy": [], "sampled": [[0.1]]}}, "rank_profile.greedy"),
        ([1, 2], "not a JSON object"),
        (
            {"rank_profile": {"greedy": [[0.7]], "sampled": [[0.1]], "drawn": [[1.5]]}},
            "rank_profile.drawn",
        ),
    ],
    ids=[
        "rates-over-one",
        "a-class-missing",
        "not-numbers",
        "no-depth",
        "not-an-object",
        "drawn-over-one",
    ],
)
def test_a_malformed_profile_is_refused_naming_the_file(
    tmp_path: Path, report: object, names: str
) -> None:
    with pytest.raises(ValueError, match=r"training\.json") as error:
        read_rank_priors(_write(tmp_path, report))
    assert names in str(error.value) and ("rewrite it with train-draft" in str(error.value))
