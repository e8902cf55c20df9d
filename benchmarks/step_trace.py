"""How much of the package one decode step runs through: files, and frames before the model.

Builds the embedded default engine on the CPU (the tiny random Llama and its EAGLE head, written
into a temporary cache; the v2 tree worker; eager, synchronous), runs the prefill and a few decode
steps, then traces one decode-only ``Engine.step`` with ``sys.setprofile`` and prints

* the number of distinct ``eagletree/`` files whose code ran in it;
* the depth, in eagletree frames, from ``Engine.step`` to the first model ``forward`` (a
  function named ``forward`` in ``eagletree/adapters/models/``), and those frames by name.

    python -m benchmarks.step_trace [--files]     # --files: list them

It also runs against a tree from before ``app/`` was split by concern, where the engine is built
by ``Engine.from_settings`` and the composition modules sit directly under ``app/``: run this
file by its path with that tree first on ``PYTHONPATH`` (from a directory holding no
``eagletree``).
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import eagletree
from eagletree import EngineSettings, SamplingParams

NUM_REQUESTS = 2
PROMPT_LEN = 12
WARMUP_STEPS = 3  # the prefill, then decode steps


def _module(*names: str) -> ModuleType:
    """The first of ``names`` that imports (a module's home before and after the split)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"none of {names}")


def _build_engine(settings: EngineSettings) -> Any:
    try:
        build = eagletree.build_engine  # type: ignore[attr-defined,unused-ignore]
    except AttributeError:  # before the split: a classmethod of the engine
        build = eagletree.Engine.from_settings  # type: ignore[attr-defined,unused-ignore]
    return build(settings)


def _settings(cache: Path) -> EngineSettings:
    checkpoint = _module(
        "eagletree.app.composition.default_checkpoint", "eagletree.app.default_checkpoint"
    )
    run_settings = _module("eagletree.app.composition.run_settings", "eagletree.app.run_settings")
    target = checkpoint.ensure_default_checkpoint(
        notify=lambda _: None, environ={"XDG_CACHE_HOME": str(cache)}
    )
    settings = EngineSettings(
        model={
            "target_path": str(target),
            "draft_path": str(checkpoint.default_draft_dir(target)),
            "device": "cpu",
        },
        speculative={"algorithm": "eagle"},
        backend={"cuda_graph": "off"},
        scheduler={"overlap": "off"},
    )
    resolved: EngineSettings = run_settings.settings_for_run(settings, lambda _: None)
    return resolved


class _StepTrace:
    """The profile hook: files entered, and the frames above the first model forward."""

    def __init__(self, root: Path, entry: Any) -> None:
        self._root = str(root)
        self._models = str(root / "adapters" / "models")
        self._entry = entry  # the code object of Engine.step
        self.files: set[str] = set()
        self.frames: list[str] | None = None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(self._root):
            return
        self.files.add(path)
        model = path.startswith(self._models) and frame.f_code.co_name == "forward"
        if model and self.frames is None:
            self.frames = self._chain(frame)

    def _chain(self, frame: FrameType) -> list[str]:
        """Eagletree frames from ``Engine.step`` down to ``frame``, outermost first."""
        chain: list[str] = []
        current: FrameType | None = frame
        while current is not None:
            code = current.f_code
            if code.co_filename.startswith(self._root):
                chain.append(f"{code.co_qualname} ({Path(code.co_filename).name})")
            if code is self._entry:
                return chain[::-1]
            current = current.f_back
        raise AssertionError("the model forward ran outside Engine.step")


def main() -> None:
    root = Path(eagletree.__file__).parent
    with tempfile.TemporaryDirectory() as cache:
        engine = _build_engine(_settings(Path(cache)))
        for i in range(NUM_REQUESTS):
            prompt = [(7 * i + j) % 200 + 1 for j in range(PROMPT_LEN)]
            engine.submit(prompt, SamplingParams(max_new_tokens=64))
        for _ in range(WARMUP_STEPS):
            engine.step()
        scheduler = engine.scheduler
        assert not scheduler.waiting and len(scheduler.running) == NUM_REQUESTS, "not decode-only"
        trace = _StepTrace(root, type(engine).step.__code__)
        sys.setprofile(trace)
        try:
            engine.step()
        finally:
            sys.setprofile(None)
        engine.close()
    worker = type(engine.worker).__name__
    print(f"eagletree at {root}; worker {worker}; one decode-only Engine.step")
    print(f"files run: {len(trace.files)}")
    if "--files" in sys.argv[1:]:
        for path in sorted(trace.files):
            print(f"  {Path(path).relative_to(root.parent)}")
    if trace.frames is None:
        print("no model forward ran")
        return
    print(f"depth from Engine.step to the first model forward: {len(trace.frames) - 1}")
    for depth, name in enumerate(trace.frames):
        print(f"  {depth:2d}  {name}")


if __name__ == "__main__":
    main()
