"""Every v2, MTP-v2 and plain worker step of the integration tests runs under the sync tripwire.

The server tests are left out: their engine steps in a thread of its own, and the tripwire
patches ``torch.Tensor`` for the whole process while a step runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from tests.sync_tripwire import wrap_steps

_SERVER_TESTS = Path(__file__).parent / "server"


@pytest.fixture(autouse=True)
def _sync_free_steps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if _SERVER_TESTS in Path(request.node.path).parents:
        return
    wrap_steps(monkeypatch, EagleWorkerV2)
    wrap_steps(monkeypatch, MultiLayerEagleWorkerV2)
    wrap_steps(monkeypatch, NonSpeculativeWorker)
