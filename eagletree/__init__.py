"""eagletree: EAGLE speculative decoding over draft trees.

The public surface is imported lazily so that `import eagletree` stays cheap and does no work
beyond defining names; `eagletree.domain` can be used without pydantic or dependency-injector.

    from eagletree import EngineSettings, build_engine

    with build_engine(EngineSettings(model={"target_path": "ckpt"})) as engine:
        print(engine.generate(["Hello"], max_new_tokens=16)[0].text)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from eagletree.app.composition.container import build_engine
    from eagletree.app.engine.loop import Engine
    from eagletree.app.engine.reports import GenerationResult
    from eagletree.app.engine.streaming import StreamEvent
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError, EagleTreeError
    from eagletree.domain.sampling import SamplingParams

# name -> the module that defines it, imported on first access
_LAZY = {
    "build_engine": "eagletree.app.composition.container",
    "Engine": "eagletree.app.engine.loop",
    "GenerationResult": "eagletree.app.engine.reports",
    "StreamEvent": "eagletree.app.engine.streaming",
    "EngineSettings": "eagletree.config.settings",
    "SamplingParams": "eagletree.domain.sampling",
    "ConfigurationError": "eagletree.domain.errors",
    "EagleTreeError": "eagletree.domain.errors",
}

__all__ = [
    "ConfigurationError",
    "EagleTreeError",
    "Engine",
    "EngineSettings",
    "GenerationResult",
    "SamplingParams",
    "StreamEvent",
    "__version__",
    "build_engine",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eagletree' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
