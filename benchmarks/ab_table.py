"""Benchmarks: the tables of A/B arms side by side — one markdown table per table of the arms'
outputs, each cell that differs between the arms written ``a / b / …`` in the arms' order.

The arms ran the same benchmark (``bash scripts/gpu.sh ab ARM… -- bench NAME …``), so their
tables have the same header and rows, and the cells that name a row (mode, bs, config …) are
equal in every arm: those are written once. A table whose header or row count differs between
the arms is printed once per arm instead, one after the other.

    python -m benchmarks.ab_table base=ab-out/base.md new=ab-out/new.md
"""

from __future__ import annotations

import argparse
from pathlib import Path


def tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of ``text``: each a list of rows, each row a list of cells."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            found.append(rows)
            rows = []
    return found


def merged(arms: list[str], per_arm: list[list[list[str]]]) -> list[str]:
    """One table of the arms' versions of a table, or each version after the other."""
    first = per_arm[0]
    shapes = {(tuple(t[0]), tuple(len(row) for row in t)) for t in per_arm}
    if len(shapes) > 1:
        lines = []
        for arm, table in zip(arms, per_arm, strict=True):
            lines += ["", f"{arm}:", "", *("| " + " | ".join(row) + " |" for row in table)]
        return lines
    lines = [f"cells that differ: {' / '.join(arms)}", ""]
    for r, row in enumerate(first):
        cells = []
        for c, cell in enumerate(row):
            values = [table[r][c] for table in per_arm]
            cells.append(cell if len(set(values)) == 1 else " / ".join(values))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def side_by_side(arms: dict[str, str]) -> str:
    """The arms' markdown outputs (arm name → text) as one text of merged tables."""
    names = list(arms)
    per_arm = [tables(text) for text in arms.values()]
    count = min(len(found) for found in per_arm)
    lines: list[str] = []
    if len({len(found) for found in per_arm}) > 1:
        lines += [f"(the arms printed different numbers of tables: the first {count} follow)", ""]
    for index in range(count):
        lines += [*merged(names, [found[index] for found in per_arm]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="+", metavar="NAME=FILE", help="each arm's markdown output")
    parser.add_argument("--out", help="also write the merged tables to this file")
    args = parser.parse_args()
    arms = {}
    for spec in args.arms:
        name, _, path = spec.rpartition("=")
        arms[name or Path(path).stem] = Path(path).read_text(encoding="utf-8")
    text = side_by_side(arms)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
