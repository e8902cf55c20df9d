"""The embedded default model: a tiny random Llama (and EAGLE head) made on first use.

Until trained weights ship, `eagletree generate` without a checkpoint runs this one; it has a
small byte-level tokenizer with a chat template, so prompts and output are text. It lives in
the user cache directory (``$XDG_CACHE_HOME/eagletree``, else ``~/.cache/eagletree``), is
written once into a temporary directory and renamed into place, so concurrent first runs do not
see half a checkpoint; later runs reuse it. Its tokens are meaningless: it proves the pipeline.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from eagletree.domain.errors import ConfigurationError

# Bump the name when the preset or the writer changes so that old caches are not reused.
DEFAULT_CHECKPOINT_NAME = "default-llama-tiny-v2"
DEFAULT_SEED = 0


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/eagletree``, or ``~/.cache/eagletree`` when it is unset or empty."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eagletree"


def default_checkpoint_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the default checkpoint lives: ``<cache>/<name>/target`` (and ``…/draft``)."""
    return cache_dir(environ) / DEFAULT_CHECKPOINT_NAME


def ensure_default_checkpoint(
    notify: Callable[[str], None] = print, environ: Mapping[str, str] | None = None
) -> Path:
    """The default target checkpoint directory, written first (and announced) if missing."""
    from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
    from eagletree.adapters.models.random_checkpoint_config import ModelSizes
    from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer

    root = default_checkpoint_dir(environ)
    target = root / "target"
    if (target / "config.json").is_file():
        return target
    notify(
        f"no model.target_path set: creating the default tiny random checkpoint in {root} "
        "(first use only; its output is random tokens)"
    )
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    except OSError as error:
        raise ConfigurationError(
            f"cannot create the default checkpoint in {root.parent} ({error.strerror}): set "
            "XDG_CACHE_HOME to a writable directory, or model.target_path to a checkpoint"
        ) from None
    try:
        target_dir, _ = write_random_checkpoint(
            staging, "llama", "eagle", seed=DEFAULT_SEED, dtype=torch.float32
        )
        write_byte_level_tokenizer(target_dir, ModelSizes().vocab_size)
        try:
            staging.rename(root)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent first run: a failure
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def default_draft_dir(target: Path) -> Path:
    """The EAGLE head written beside the default target by ``ensure_default_checkpoint``."""
    return target.parent / "draft"
