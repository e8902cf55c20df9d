"""Benchmark: gathering a few bf16 rows of a table — the draft's embedding of its k branch
tokens at every draft depth — by ``index_select`` (what ``nn.Embedding`` runs) against an
advanced index (``table[ids]``, an elementwise kernel over the output).

At bs 1 the profile of a width-8 tree shows ``indexSelectSmallIndex`` at 4.4 µs for 8 rows
against 2.2 for one: its threads walk the indices one after another. Rows are scattered ids of
a 16k-entry table (the real pair) and a 128k one (Llama-3), hidden 768 and 4096. One CUDA graph
runs the call over ``COPIES`` distinct id tensors (``timing.replay_us``); every variant's rows
are checked against ``index_select`` first. Times are printed, never asserted.

    python -m benchmarks.row_gather --out row_gather.md
    python -m benchmarks.row_gather --smoke
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.printed_table import PrintedTable
from benchmarks.timing import replay_us

TABLES = ((16384, 768), (128256, 4096))
ROWS = (1, 8, 16, 64, 512)
COPIES = 4
Gather = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _index_select(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return table.index_select(0, ids)


def _advanced_index(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return table[ids]


def _embedding(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


VARIANTS: dict[str, Gather] = {
    "index_select": _index_select,
    "embedding": _embedding,
    "table[ids]": _advanced_index,
}


def measure(entries: int, hidden: int, rows: int, device: torch.device) -> str:
    gen = torch.Generator().manual_seed(entries + rows)
    table = torch.randn(entries, hidden, generator=gen).to(torch.bfloat16).to(device)
    ids = [torch.randint(0, entries, (rows,), generator=gen).to(device) for _ in range(COPIES)]
    expected = _index_select(table, ids[0])
    cells = []
    for name, gather in VARIANTS.items():
        if not torch.equal(gather(table, ids[0]), expected):
            raise AssertionError(f"{name}: rows differ from index_select")
        cells.append(replay_us([partial(gather, table, i) for i in ids], device))
    return f"| {entries} × {hidden} | {rows} | " + " | ".join(f"{us:.2f}" for us in cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="markdown file for the table")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, CPU")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    tables = ((1000, 64),) if args.smoke else TABLES
    rows_list = (1, 8) if args.smoke else ROWS
    table = PrintedTable(
        "| table | rows | " + " | ".join(f"{name} µs" for name in VARIANTS) + " |",
        "|---|---|" + "---|" * len(VARIANTS),
    )
    for entries, hidden in tables:
        for rows in rows_list:
            table.add(measure(entries, hidden, rows, device))
    table.write(args.out)


if __name__ == "__main__":
    main()
