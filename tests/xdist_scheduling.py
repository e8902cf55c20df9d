"""The work units of ``pytest -n 2 --dist loadgroup`` (.ci/run), from the test's path.

A unit is one test, so that the two workers stay evenly loaded to the end, except where
fixtures are costly to build twice: the server tests share one session-scoped server (one
unit), each multi-process module spawns its ranks once for all its tests (a unit each), and
the training tests' modules share a target and heads trained once for their folder (one
unit). Units of many tests go first. (xdist
3.8 groups ``xdist_group`` marks by renaming ``item._nodeid``, which pytest 9 no longer reads;
this scheduler needs no marks.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

WHOLE_FOLDERS = ("tests/integration/server/", "tests/integration/train_draft/")
WHOLE_MODULES_UNDER = ("tests/integration/parallel/",)


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its folder or its module if that is whole, or itself."""
    path = nodeid.split("::", 1)[0]
    for folder in WHOLE_FOLDERS:
        if path.startswith(folder):
            return folder
    if path.startswith(WHOLE_MODULES_UNDER):
        return path
    return nodeid


class CostlyFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling (largest units first) over ``work_unit``'s units."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
