"""Streaming: what a request produced since it was last looked at, as token ids and text.

``OutputWatcher`` follows one live ``Request``; ``poll`` returns the tokens committed since
the previous poll and the text they complete. Text is decoded from the whole output each
time and the new suffix is emitted, held back while it ends in an incomplete character (a
multi-byte character split across tokens decodes to U+FFFD until its last byte arrives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagletree.domain.request import FinishReason, RequestStatus

if TYPE_CHECKING:
    from eagletree.app.engine.reports import GenerationResult
    from eagletree.domain.request import Request
    from eagletree.ports.tokenizer import Tokenizer

_INCOMPLETE = "\ufffd"


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """New output of prompt ``index``; the last event of a request carries ``finish_reason``
    and ``result`` (``text`` is "" without a tokenizer)."""

    index: int
    request_id: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    result: GenerationResult | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class IncrementalDecoder:
    """Text deltas of a growing id sequence."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._emitted = ""

    @property
    def text(self) -> str:
        return self._emitted

    def delta(self, ids: list[int], final: bool = False) -> str:
        text = self._tokenizer.decode(ids)
        if text.endswith(_INCOMPLETE) and not final:
            text = text.rstrip(_INCOMPLETE)
        if not text.startswith(self._emitted):  # a merge changed earlier text: emit nothing
            return ""  # until the text agrees again (rare with byte-level tokenizers)
        new = text[len(self._emitted) :]
        self._emitted = text
        return new


class OutputWatcher:
    """Follows one request; ``poll`` says what it produced since the last poll."""

    def __init__(self, index: int, request: Request, tokenizer: Tokenizer | None) -> None:
        self.index = index
        self.request = request
        self._sent = 0
        self._decoder = IncrementalDecoder(tokenizer) if tokenizer is not None else None
        self.done = False

    def poll(self) -> StreamEvent | None:
        """The new tokens (and text), or None when nothing changed; finished once FINISHED."""
        if self.done:
            return None
        request = self.request
        finished = request.status is RequestStatus.FINISHED
        output = request.output_ids
        if len(output) == self._sent and not finished:
            return None
        new = list(output[self._sent :])
        self._sent = len(output)
        text = "" if self._decoder is None else self._decoder.delta(list(output), final=finished)
        self.done = finished
        return StreamEvent(
            self.index,
            request.request_id,
            new,
            text,
            finish_reason=request.finish_reason if finished else None,
        )

    @property
    def text(self) -> str | None:
        return None if self._decoder is None else self._decoder.text
