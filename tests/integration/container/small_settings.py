"""Small settings for the composition-root tests: a tree draft over placeholder
checkpoints and a 64-slot pool, any section overridable."""

from __future__ import annotations

from typing import Any

from eagletree.config.settings import EngineSettings

SMALL_MEMORY = {"max_total_tokens": 64, "max_running_requests": 4}
TREE = {"algorithm": "eagle", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}
CHECKPOINTS = {"target_path": "/t", "draft_path": "/d"}


def settings(
    device: str = "cpu",
    *,
    model: dict[str, Any] | None = None,
    speculative: dict[str, Any] | None = None,
    memory: dict[str, Any] | None = None,
    backend: dict[str, Any] | None = None,
) -> EngineSettings:
    return EngineSettings(
        model={**CHECKPOINTS, "device": device, "max_context_len": 32, **(model or {})},
        speculative=speculative if speculative is not None else TREE,
        memory={**SMALL_MEMORY, **(memory or {})},
        backend=backend or {},
    )
