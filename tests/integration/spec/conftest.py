"""Every v2 and MTP-v2 worker step of the speculative tests runs under the sync tripwire."""

from __future__ import annotations

import pytest

from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from tests.sync_tripwire import wrap_steps


@pytest.fixture(autouse=True)
def _sync_free_v2_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    wrap_steps(monkeypatch, EagleWorkerV2)
    wrap_steps(monkeypatch, MultiLayerEagleWorkerV2)
