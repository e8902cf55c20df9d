"""Adapter: a checkpoint's tokenizer through transformers.AutoTokenizer (local files only).

Reads tokenizer.json or a sentencepiece tokenizer.model with tokenizer_config.json (chat
template, BOS / EOS). A checkpoint without tokenizer files has no tokenizer (None); files that
are present but unreadable are a ConfigurationError naming the directory.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagletree.domain.errors import ConfigurationError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class HFTokenizer:
    """``Tokenizer`` over a transformers tokenizer object."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self._tokenizer = tokenizer
        self.source = source

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tokenizer, "chat_template", None))

    @property
    def eos_token_id(self) -> int | None:
        value = self._tokenizer.eos_token_id
        return value if isinstance(value, int) else None

    def encode(self, text: str) -> list[int]:
        # verbose=False: transformers warns of texts above the tokenizer's model_max_length,
        # but the engine checks lengths against its own context (and token-map counts corpora)
        return list(self._tokenizer.encode(text, verbose=False))

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not self.has_chat_template:
            raise ValueError(
                f"the tokenizer of {self.source} has no chat template; send a plain prompt"
            )
        try:
            rendered = self._tokenizer.apply_chat_template(
                [dict(message) for message in messages],
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as error:  # jinja errors: a message the template does not accept
            raise ValueError(f"the chat template rejected the messages: {error}") from None
        return list(self._tokenizer.encode(rendered, add_special_tokens=False, verbose=False))


def load_tokenizer(path: str | Path) -> HFTokenizer | None:
    """The tokenizer stored in checkpoint directory ``path``, or None when it has none."""
    path = Path(path)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return None
    if importlib.util.find_spec("transformers") is None:
        raise ConfigurationError(
            f"{path} has a tokenizer but transformers is not installed: pip install 'eagletree[hf]'"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # transformers raises many types for unreadable files
        first_line = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise ConfigurationError(
            f"{path}: the tokenizer files ({', '.join(_present(path))}) cannot be read "
            f"({type(error).__name__}: {first_line}); fix or remove them"
        ) from None
    return HFTokenizer(tokenizer, str(path))


def _present(path: Path) -> list[str]:
    return [name for name in TOKENIZER_FILES if (path / name).is_file()]
