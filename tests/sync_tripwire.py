"""Test support: a CPU tripwire for host syncs inside a worker's step.

On CUDA a step that reads a device value back stalls the host until the device catches up
(``torch.cuda.set_sync_debug_mode("error")`` proves the absence of that in the GPU suite). On
the CPU every tensor is a host tensor, so there is nothing to stall on; what the tripwire
catches instead is every way a step could turn a tensor into host data:

* ``Tensor.item``, ``tolist``, ``numpy``, ``__bool__`` (``if t:``, ``assert t``, ``and``) and
  ``nonzero`` (whose output size depends on the values) on any tensor;
* ``Tensor.cpu`` (a device → host copy wherever the tensor lives);
* with ``strict`` also ``__int__``, ``__float__`` and ``__index__`` (``int(t)``, ``range(t)``),
  which a step with exact host lengths may apply to its host copies (``seq_lens_cpu``) but a
  decode step launched ahead of the host (``exact_lengths`` False) must not.

Host data a step legitimately needs is Python ints from the plan (lengths, rows) and tensors it
builds from them; the tripwire does not object to building tensors. What it judges is the code
that asked: the first caller outside torch. Methods of test doubles that stand in for a model
on the host (oracle drafts: their class sets ``HOST_STAND_IN = True``) are exempt, and so are
the pools' debug checks (``DEBUG_CHECKS``), which run on the CPU always but on CUDA only with
``debug_checks``.
``wrap_steps`` arms the tripwire around every ``step`` of a worker class.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from eagletree.app.engine.plan import SchedulePlan
from eagletree.app.workers.step_graphs import DecodeStepRunner


class HostSyncError(AssertionError):
    """A worker's step read a tensor back to the host."""


_ALWAYS = ("item", "tolist", "numpy", "__bool__", "nonzero", "cpu")
_STRICT = ("__int__", "__float__", "__index__")
# eagletree functions whose reads are debug checks, skipped on CUDA unless asked for
DEBUG_CHECKS = frozenset({"check_independent_groups", "check_slots_in_range"})
_TORCH_DIR = os.path.dirname(torch.__file__)


def _asker_is_exempt() -> bool:
    """Whether the first caller outside torch (and this module) may read tensors back."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_TORCH_DIR) and path != os.path.abspath(__file__):
            break
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return True
    asker = frame.f_locals.get("self")
    if getattr(type(asker), "HOST_STAND_IN", False):
        return True
    while frame is not None:  # a debug check of a pool, however deep the read inside it
        if frame.f_code.co_name in DEBUG_CHECKS:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _tripped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refuse(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _asker_is_exempt():
            return original(self, *args, **kwargs)
        raise HostSyncError(f"Tensor.{name} inside a worker's step (shape {tuple(self.shape)})")

    return refuse


@contextlib.contextmanager
def no_host_sync(*, strict: bool = False) -> Iterator[None]:
    """Inside the block, the conversions above raise ``HostSyncError``."""
    names = _ALWAYS + (_STRICT if strict else ())
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, _tripped(name, saved[name]))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def wrap_steps(monkeypatch: pytest.MonkeyPatch, worker_class: type) -> None:
    """Run every ``worker_class.step`` under the tripwire, and its decode steps launched ahead
    of the host (``exact_lengths`` False) under the strict one: a prefill in the same step has
    exact host lengths of its own and may size its batch from them."""
    step = getattr(worker_class, "step")  # noqa: B009 (any worker class)

    @functools.wraps(step)
    def guarded(self: Any, plan: SchedulePlan) -> Any:
        with no_host_sync():
            return step(self, plan)

    monkeypatch.setattr(worker_class, "step", guarded)
    run = DecodeStepRunner.run
    if getattr(run, "_strict_when_ahead", False):
        return

    @functools.wraps(run)
    def strict_when_ahead(self: Any, *args: Any, exact_lengths: bool = True, **kwargs: Any) -> Any:
        if exact_lengths:  # the guard of the step around it, if any, is enough
            return run(self, *args, **kwargs)
        with no_host_sync(strict=True):
            return run(self, *args, exact_lengths=False, **kwargs)

    strict_when_ahead._strict_when_ahead = True  # type: ignore[attr-defined]
    monkeypatch.setattr(DecodeStepRunner, "run", strict_when_ahead)
