"""Port: a tokenizer — text to token ids (BOS as the checkpoint wants), ids to text, chat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class Tokenizer(Protocol):
    """The checkpoint's tokenizer. ``encode`` adds the special tokens the tokenizer declares
    (BOS for Llama); ``apply_chat_template`` renders messages with the checkpoint's chat
    template and the assistant prompt, BOS included by the template; ``decode`` drops special
    tokens."""

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]: ...
