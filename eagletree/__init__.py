"""eagletree: EAGLE speculative decoding over draft trees.

The public surface is imported lazily so that `import eagletree` stays cheap and does no work
beyond defining names; `eagletree.domain` can be used without pydantic or dependency-injector.

    from eagletree import Engine, EngineSettings

    with Engine.from_settings(EngineSettings(model={"target_path": "ckpt"})) as engine:
        print(engine.generate(["Hello"], max_new_tokens=16)[0].text)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from eagletree.app.engine import Engine
    from eagletree.app.engine_reports import GenerationResult
    from eagletree.app.streaming import StreamEvent
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError, EagleTreeError
    from eagletree.domain.request import SamplingParams

# name -> the module that defines it, imported on first access
_LAZY = {
    "Engine": "eagletree.app.engine",
    "GenerationResult": "eagletree.app.engine_reports",
    "StreamEvent": "eagletree.app.streaming",
    "EngineSettings": "eagletree.config.settings",
    "SamplingParams": "eagletree.domain.request",
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
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eagletree' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
