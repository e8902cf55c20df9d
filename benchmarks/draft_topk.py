"""Benchmark: the draft's top-k with probabilities (``draft_topk.top_k_probs``) over its tiles —
vocabulary entries per first-stage program and warps per program — against torch's softmax +
top-k, at the row counts a tree step gives it (bs × k rows: bs 1–64, k 1–8). "mapped µs" is the
default tile with a draft's column → target id map folded into the merge (a reduced draft
vocabulary), beside the top-k followed by a separate gather of the ids, as before the fold.

Logits are bf16, by default over Llama-3's 128 256-entry vocabulary and EAGLE-3's 32 000, k = 4
(``--vocabs``, ``--rows`` and ``--k`` choose others). One CUDA graph runs
the call over ``COPIES`` distinct logit buffers so that little is served from L2 and no launch is
timed (``timing.replay_us``); "µs" is the median replay divided by the calls. Every tile's tokens
are checked against the reference first. Times are printed, never asserted.

    python -m benchmarks.draft_topk --out draft_topk.md
    python -m benchmarks.draft_topk --k 8 --vocabs 16384 --rows 8 64   # the real pair's tree
    TRITON_INTERPRET=1 python -m benchmarks.draft_topk --smoke
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch

from benchmarks.printed_table import PrintedTable
from benchmarks.timing import replay_us
from eagletree.adapters.kernels.triton.draft_topk import TopKConfig, default_config, top_k_probs
from eagletree.domain.sampling import top_k_probs as reference_top_k

VOCABS = (128256, 32000)
ROWS = (4, 8, 32, 128, 256)
COPIES = 4
# the one-warp tiles, printed beside the best: below the default's 4M-logit threshold, which of
# them wins depends on k (a chunk's top-k is k rounds of reductions)
ONE_WARP = (TopKConfig(512, 1), TopKConfig(1024, 1))


def tiles(smoke: bool) -> list[TopKConfig]:
    if smoke:
        return [TopKConfig(64, 1), TopKConfig(256, 2)]
    return [TopKConfig(*c) for c in itertools.product((512, 1024, 2048, 4096), (1, 2, 4, 8))]


def measure(vocab: int, rows: int, k: int, cfgs: list[TopKConfig], device: torch.device) -> str:
    gen = torch.Generator().manual_seed(rows + vocab)
    copies = [
        (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16).to(device)
        for _ in range(COPIES)
    ]
    _, expected = reference_top_k(copies[0], k)
    torch_us = replay_us([partial(reference_top_k, x, k) for x in copies], device)
    default = default_config(rows, vocab)
    timed: dict[TopKConfig, float] = {}
    for cfg in [*cfgs, default]:
        if cfg in timed:
            continue
        _, tokens = top_k_probs(copies[0], k, config=cfg)
        if not torch.equal(tokens.cpu(), expected.cpu()):
            raise AssertionError(f"vocab {vocab} rows {rows} {cfg}: tokens differ")
        timed[cfg] = replay_us([partial(top_k_probs, x, k, config=cfg) for x in copies], device)
    best = min(timed, key=timed.__getitem__)
    # columns named by scattered ids of a vocabulary twice as large
    token_ids = torch.randperm(2 * vocab, generator=gen)[:vocab].to(device)
    _, mapped = top_k_probs(copies[0], k, token_ids)
    if not torch.equal(mapped.cpu(), token_ids.cpu()[expected.cpu()]):
        raise AssertionError(f"vocab {vocab} rows {rows}: mapped tokens differ")
    mapped_us = replay_us([partial(top_k_probs, x, k, token_ids) for x in copies], device)
    gather_us = replay_us([partial(_then_gather, x, k, token_ids) for x in copies], device)
    return (
        f"| {vocab} | {rows} | {k} | {torch_us:.1f} | {timed[default]:.1f} (c{default.chunk}"
        f" w{default.num_warps}) | {timed[best]:.1f} | c{best.chunk} w{best.num_warps} |"
        f" {timed[default] / timed[best]:.2f} | {mapped_us:.1f} | {gather_us:.1f} | "
        + " | ".join(f"{timed[c]:.1f}" if c in timed else "—" for c in ONE_WARP)
        + " |"
    )


def _then_gather(logits: torch.Tensor, k: int, token_ids: torch.Tensor) -> torch.Tensor:
    return token_ids[top_k_probs(logits, k)[1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="markdown file for the table")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--k", type=int, default=4, help="tokens kept a row (the tree's width)")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    vocabs = (1000,) if args.smoke else args.vocabs
    rows_list = (4,) if args.smoke else args.rows
    table = PrintedTable(
        "| vocab | rows | k | torch µs | default µs (tile) | best µs | best tile | default ÷ best"
        " | mapped µs | then gather µs | "
        + " | ".join(f"c{c.chunk} w{c.num_warps} µs" for c in ONE_WARP)
        + " |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(ONE_WARP),
    )
    for vocab in vocabs:
        for rows in rows_list:
            table.add(measure(vocab, rows, args.k, tiles(args.smoke), device))
    table.write(args.out)


if __name__ == "__main__":
    main()
