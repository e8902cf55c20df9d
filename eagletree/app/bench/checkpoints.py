"""Application: the random checkpoints `eagletree bench --preset` decodes, written on first use.

EAGLE and EAGLE-3 heads come with a Llama target; MTP layers with a DeepSeek-MLA target (a
Llama target declares no NextN layers), which exists at the tiny preset only. A preset's target
and draft head live in ``<cache>/bench-<preset>-<draft>-v1`` (or the directory given), written
once in bf16 with seed 0 into a temporary directory and renamed into place, so an interrupted
first run leaves nothing half written; later runs reuse them.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from eagletree.app.composition.default_checkpoint import cache_dir
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.adapters.models.random_checkpoint_config import Arch

DraftKind = Literal["eagle", "eagle3", "mtp"]
# Bump when the writer or a preset changes, so that stale caches are not reused.
_VERSION = "v1"
_SEED = 0


def preset_checkpoint_dir(preset: str, draft: DraftKind) -> Path:
    """Where the cached checkpoint of ``preset`` with a ``draft`` head lives."""
    return cache_dir() / f"bench-{preset}-{draft}-{_VERSION}"


def ensure_preset_checkpoint(
    preset: str,
    draft: DraftKind,
    root: Path | None = None,
    device: str = "cpu",
    notify: Callable[[str], None] = print,
) -> tuple[Path, Path]:
    """``(target, draft)`` directories under ``root``, written (and announced) if missing."""
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.adapters.models.random_checkpoint_config import PRESETS

    if preset not in PRESETS:
        raise ConfigurationError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")

    if draft == "mtp" and preset != "tiny":
        raise ConfigurationError(
            f"--draft mtp needs a DeepSeek-MLA target and the {preset} preset is a Llama: "
            "use --draft eagle or eagle3, or --preset tiny"
        )
    arch: Arch = "deepseek-mla" if draft == "mtp" else "llama"
    root = preset_checkpoint_dir(preset, draft) if root is None else root
    target, draft_dir = root / "target", root / "draft"
    if (target / "config.json").is_file() and (draft_dir / "config.json").is_file():
        return target, draft_dir
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists but holds no complete checkpoint: remove it first")
    notify(
        f"writing a random {preset} {arch} checkpoint (bf16, {draft} head) to {root}; "
        "first use only"
    )
    started = time.perf_counter()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        write_random_checkpoint(
            staging, arch, draft, seed=_SEED, sizes=PRESETS[preset], device=device
        )
        if root.exists():  # an empty directory the caller named
            root.rmdir()
        staging.rename(root)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    notify(f"  written in {time.perf_counter() - started:.0f} s")
    return target, draft_dir
