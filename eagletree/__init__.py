"""eagletree: EAGLE speculative decoding over draft trees.

The public surface is imported lazily so that `import eagletree` stays cheap and does no work
beyond defining names; `eagletree.domain` can be used without pydantic or dependency-injector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from eagletree.config.settings import EngineSettings

__all__ = ["EngineSettings", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "EngineSettings":
        from eagletree.config.settings import EngineSettings

        return EngineSettings
    raise AttributeError(f"module 'eagletree' has no attribute {name!r}")
