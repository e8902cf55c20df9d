"""A benchmark's markdown table, printed a line at a time as it is measured (a cut-short run
still shows its rows) and written to ``--out`` at the end."""

from __future__ import annotations


class PrintedTable:
    """Prints ``head`` at once and every added line as it comes; ``write`` saves them all."""

    def __init__(self, *head: str) -> None:
        self.lines = list(head)
        print("\n".join(self.lines), flush=True)

    def add(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            print(line, flush=True)

    def write(self, path: str | None) -> None:
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(self.lines) + "\n")
