"""The sync tripwire (``tests/sync_tripwire.py``) catches a read-back inside a step,
and its strict form also ``int()`` of a tensor."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from tests.integration.spec.harness import plain_engine, speculative_engine
from tests.integration.spec.overlap.runs import MAX_NEW, ModelCache, prompts_for
from tests.sync_tripwire import HostSyncError, no_host_sync


@pytest.mark.parametrize("worker", ["v2", "plain"])
def test_the_tripwire_catches_a_read_back_inside_a_step(
    models: ModelCache, monkeypatch: pytest.MonkeyPatch, worker: str
) -> None:
    loaded = models("llama", "eagle")
    prompts = prompts_for(2, seed=1)
    worker_class = NonSpeculativeWorker if worker == "plain" else EagleWorkerV2
    name = "_decode_on_device" if worker == "plain" else "_decode_as"  # what the runner runs
    decode = getattr(worker_class, name)

    def reads_back(self: Any, *args: Any) -> tuple[torch.Tensor, ...]:
        args[-1].seq_lens.max().item()  # what the tripwire is for (the last: the inputs)
        result: tuple[torch.Tensor, ...] = decode(self, *args)
        return result

    monkeypatch.setattr(worker_class, name, reads_back)
    if worker == "plain":
        engine = plain_engine(loaded, overlap=True)
    else:
        engine = speculative_engine(loaded, 3, 1, 4).engine
    with pytest.raises(HostSyncError, match=r"Tensor\.item"):
        engine.generate(prompts, MAX_NEW)


def test_the_strict_tripwire_catches_int_of_a_tensor_and_the_plain_one_allows_it() -> None:
    lens = torch.tensor([3, 4])
    with no_host_sync():
        assert int(lens.sum()) == 7  # a host copy's sum: allowed while lengths are exact
        with pytest.raises(HostSyncError, match=r"Tensor\.__bool__"):
            _ = bool(lens.any())
    with no_host_sync(strict=True), pytest.raises(HostSyncError, match=r"Tensor\.__int__"):
        int(lens.sum())
    assert lens.sum().item() == 7  # disarmed again
