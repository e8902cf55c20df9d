"""Application: the progress bar of `eagletree bench`, one line per measured row on stderr.

On a terminal the line redraws itself as tokens come in; elsewhere (CI logs, files) only the
finished line is written, so logs stay one line per row.
"""

from __future__ import annotations

import time
from typing import TextIO

_WIDTH = 24


class ProgressBar:
    """``label [#####-----] done/total unit`` with a live counter; ``close`` ends the line."""

    def __init__(self, stream: TextIO, label: str, total: int, unit: str = "tokens") -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._label = label
        self._total = max(total, 1)
        self._unit = unit
        self._done = 0
        self._last_draw = 0.0

    def update(self, done: int) -> None:
        self._done = min(done, self._total)
        now = time.perf_counter()
        if self._tty and now - self._last_draw >= 0.1:
            self._last_draw = now
            self._stream.write(f"\r{self._line()}\033[K")
            self._stream.flush()

    def close(self, note: str = "") -> None:
        line = self._line() + (f"  {note}" if note else "")
        self._stream.write(f"\r{line}\033[K\n" if self._tty else f"{line}\n")
        self._stream.flush()

    def _line(self) -> str:
        filled = round(_WIDTH * self._done / self._total)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        return f"{self._label} [{bar}] {self._done}/{self._total} {self._unit}"
