"""Test support: the hypothesis profiles (derandomised "ci", randomised "dev") and budgets.

``ci`` draws the same examples on every run (seeded from each test's own definition, no example
database, no timing checks), so a CI failure reproduces anywhere. ``dev`` draws fresh examples on
every run and four times as many; developers run it before they stop. Tests state the budget
tuned for CI through ``examples(n)``, which scales it with the loaded profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 100
DEV_EXAMPLES = 4 * CI_EXAMPLES


def register_profiles() -> None:
    settings.register_profile(
        "ci",
        max_examples=CI_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=DEV_EXAMPLES, deadline=None, print_blob=True)


def load_profile_from_environment() -> None:
    """``HYPOTHESIS_PROFILE`` names the profile; otherwise ``CI=true`` selects "ci", and a plain
    local run keeps hypothesis's own randomised default. ``--hypothesis-profile`` overrides both."""
    name = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "")
    if name:
        settings.load_profile(name)


def examples(ci_budget: int) -> int:
    """``ci_budget`` examples under "ci" (and the default profile), proportionally more under
    "dev": a test's budget is tuned to its cost, the profile says how hard to look."""
    return max(1, ci_budget * settings().max_examples // CI_EXAMPLES)  # the loaded profile's
