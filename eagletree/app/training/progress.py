"""App: a one-line progress display for training — step, loss, draft accuracy, tokens/s."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    """Redraws one line on a terminal at most every ``interval_s``; elsewhere (logs, CI) prints
    a line every ``every`` steps and at the end."""

    def __init__(
        self,
        total: int | None,
        stream: TextIO | None = None,
        every: int = 50,
        interval_s: float = 0.5,
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.every = every
        self.interval_s = interval_s
        self._tty = self.stream.isatty()
        self._last = 0.0
        self._started = time.perf_counter()
        self._tokens = 0

    def update(self, step: int, loss: float, accuracy: tuple[float, ...], num_tokens: int) -> None:
        self._tokens += num_tokens
        now = time.perf_counter()
        due = now - self._last >= self.interval_s if self._tty else step % self.every == 0
        if not due and step != self.total:
            return
        self._last = now
        rate = self._tokens / max(now - self._started, 1e-9)
        of = f"/{self.total}" if self.total else ""
        accs = " ".join(f"{a:.2f}" for a in accuracy)
        text = f"step {step}{of}  loss {loss:.4f}  acc@step {accs}  {rate:,.0f} tok/s"
        if self._tty:
            self.stream.write("\r" + text.ljust(100))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
