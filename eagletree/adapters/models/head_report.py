"""What a draft head's training measured and the engine can start from: the rank profiles that
``eagletree train-draft`` writes to ``training.json`` beside the head (``"rank_profile"``:
``{"greedy": [[rate per rank] per depth], "sampled": [...], "drawn": [[rate per draw] per
depth]}``, docs/training.md; ``drawn``, each draw's acceptance when a node's drafts are drawn
from the head, is newer: a report without it has the other two, an older one its first draw
only).

The adaptive policy prices shapes by learned acceptance; before a request class has any step
read back it assumes a prior, and the head's own measurement is a better one than a constant.
A head without the file or the key has no prior (the policy's default applies); a file that
names one but is malformed is an error, not a silent default.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagletree.domain.draft_shape import RankProfile

REPORT_NAME = "training.json"
CLASSES = ("greedy", "sampled")
OPTIONAL_CLASSES = ("drawn",)


def read_rank_priors(draft_path: str | Path | None) -> dict[str, RankProfile]:
    """The head's rank profiles by class (``greedy``, ``sampled`` and, where measured,
    ``drawn``), or {} when it has none."""
    if draft_path is None:
        return {}
    report = Path(draft_path) / REPORT_NAME
    if not report.is_file():
        return {}
    try:
        profiles = json.loads(report.read_text(encoding="utf-8")).get("rank_profile")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise ValueError(
            f"{report}: not a JSON object ({error}); rewrite it with train-draft or remove it"
        ) from None
    if profiles is None:
        return {}
    priors = {}
    present = [n for n in OPTIONAL_CLASSES if isinstance(profiles, dict) and n in profiles]
    for name in (*CLASSES, *present):
        rows = profiles.get(name) if isinstance(profiles, dict) else None
        try:
            if not isinstance(rows, list):
                raise TypeError(f"got {type(rows).__name__}")
            priors[name] = RankProfile(tuple(tuple(float(r) for r in row) for row in rows))
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{report}: rank_profile.{name} must be a list per depth of acceptance rates "
                f"per rank, each row summing to at most 1 ({error}); rewrite it with "
                "train-draft or remove the key"
            ) from None
    return priors
