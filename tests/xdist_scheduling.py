"""The work units of ``pytest -n 2 --dist loadgroup`` (.ci/run), from the test's path.

Each integration module runs whole on one worker, so that its module-scoped checkpoints,
engines and spawned groups are built once; the server tests share one session-scoped server,
so they are one unit. Unit and contract tests are a unit each, and fill the workers' tails.
(pytest-xdist 3.8 groups ``xdist_group`` marks by renaming ``item._nodeid``, which pytest 9
no longer reads; this scheduler needs no marks.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

SERVER_TESTS = "tests/integration/server/"
INTEGRATION_TESTS = "tests/integration/"


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its server group, its integration module, or itself."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(SERVER_TESTS):
        return SERVER_TESTS
    if path.startswith(INTEGRATION_TESTS):
        return path
    return nodeid


class IntegrationModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling (largest units first) over ``work_unit``'s units."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
