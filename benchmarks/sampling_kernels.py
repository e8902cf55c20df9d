"""Benchmark: a sampled step's Triton kernels against their torch references, at the rows a
step hands them — a drawn node's children (``draw_children``: bs · k draft rows a depth, k
draws each), the tempered softmax (``tempered_probs``: the same draft rows, or bs · N verify
rows) and the walks that verify a drawn chain (its own two launches, ``verify_chain_drawn``, and
``verify_tree_drawn`` over a tree of width one, each against ``verify_chain_sampled``, at
several ``block_v``) — at the real pair's vocabulary (16,384) and Llama-3's (128,256).

Both sides are captured in a CUDA graph and replayed (``benchmarks.timing.replay_us``), as a
decode step runs them: device time without the eager launches (a call that cannot be captured
is timed eagerly, and says so). The draws' inputs are spread
distributions (a softmax of logits · 2), so a draw walks deep into its row; one row in four
keeps 3 tokens (a top-k request), whose later draws run past their support.

    python -m benchmarks.sampling_kernels --out sampling_kernels.md
    TRITON_INTERPRET=1 python -m benchmarks.sampling_kernels --smoke

Times are printed, never asserted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from benchmarks.timing import median_us, replay_us
from eagletree.adapters.kernels.triton.chain_sampling import verify_chain_drawn as chain_walk
from eagletree.adapters.kernels.triton.draw_children import draw_children as triton_draws
from eagletree.adapters.kernels.triton.tempered_probs import tempered_probs as triton_softmax
from eagletree.adapters.kernels.triton.tree_sampling import verify_tree_drawn as tree_walk
from eagletree.domain.chain_sampling import verify_chain_sampled
from eagletree.domain.sampling import tempered_probs
from eagletree.domain.tree_sampling import draw_children

VOCABS = (16_384, 128_256)
# (batch size, k): a chain's draws, a k = 4 and a k = 8 tree's, at bs 1, 8 and 64
DRAWS = ((1, 1), (1, 4), (1, 8), (8, 8), (64, 1), (64, 8))
SOFTMAX_ROWS = (1, 8, 32, 512)  # a plain step's row, a chain's draft rows, verify rows
WALK_BATCHES = (1, 64)  # a drawn chain S3's walk
WALK_BLOCKS = (1024, 4096)  # the columns a pass of the walk reads at once
Case = tuple[Callable[[], object], Callable[[], object]]  # (torch reference, Triton kernel)


def draw_case(bs: int, k: int, vocab: int, device: torch.device) -> Case:
    """The draws of one depth: bs · k rows (the root's depth: bs), k children each."""
    generator = torch.Generator().manual_seed(bs * k + vocab)
    rows = bs * k
    probs = torch.softmax(2 * torch.randn((rows, vocab), generator=generator), dim=1)
    narrow = torch.where(probs >= probs.topk(3, dim=1).values[:, 2:], probs, 0.0)
    probs[::4] = (narrow / narrow.sum(dim=1, keepdim=True))[::4]
    probs = probs.to(device)
    coins = torch.rand((rows, k), generator=generator).to(device)
    return (lambda: draw_children(probs, coins), lambda: triton_draws(probs, coins))


def softmax_case(rows: int, vocab: int, device: torch.device) -> Case:
    """bf16 logits, a quarter of the rows greedy, the rest at temperatures 0.7 and 1."""
    generator = torch.Generator().manual_seed(rows + vocab)
    logits = (3 * torch.randn((rows, vocab), generator=generator)).to(device, torch.bfloat16)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.0]).repeat(rows)[:rows].to(device)
    return (
        lambda: tempered_probs(logits, temperature),
        lambda: triton_softmax(logits, temperature),
    )


def walk_case(bs: int, vocab: int, block_v: int, walk: str, device: torch.device) -> Case:
    """The verification of a drawn chain S3 (the root and three drafts) over bs requests by
    ``walk``: the chain's two launches (``chain``) or the drawn trees' walk over a tree of width
    one (``tree``). Target and draft distributions spread independently (most chains end early,
    on a residual)."""
    generator = torch.Generator().manual_seed(bs + vocab)
    depth = 3
    draft = torch.softmax(2 * torch.randn((bs, depth, vocab), generator=generator), dim=2)
    target = torch.softmax(2 * torch.randn((bs, depth + 1, vocab), generator=generator), dim=2)
    drafts = torch.multinomial(draft.view(-1, vocab), 1, generator=generator).view(bs, depth)
    roots = torch.randint(0, vocab, (bs, 1), generator=generator)
    candidates = torch.cat([roots, drafts], dim=1)
    drawn_probs = draft.gather(2, drafts.unsqueeze(2)).squeeze(2)
    coins = torch.rand((bs, depth), generator=generator)
    bonus = torch.rand((bs,), generator=generator)
    chain = torch.arange(-1, depth).expand(bs, depth + 1)  # parents; sources alike
    ranks = torch.where(chain < 0, -1, 0)
    on = [t.to(device) for t in (candidates, target, draft, drawn_probs, coins, bonus)]
    candidates, target, draft, drawn_probs, coins, bonus = on
    chain, ranks = chain.contiguous().to(device), ranks.to(device)
    every = torch.ones(bs, dtype=torch.bool, device=device)

    def reference() -> object:
        return verify_chain_sampled(candidates, target, draft, drawn_probs, coins, bonus)

    if walk == "chain":
        return (
            reference,
            lambda: chain_walk(candidates, target, draft, coins, bonus, block_v=block_v),
        )
    return (
        reference,
        lambda: tree_walk(
            candidates, chain, ranks, chain, target, draft, every, coins, bonus, depth, 1,
            block_v=block_v,
        ),
    )  # fmt: skip


def table(
    title: str, cases: Sequence[tuple[str, Case]], device: torch.device, rep_ms: float
) -> str:
    lines = [
        f"## {title}",
        "",
        "| case | torch µs | triton µs | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for name, (reference, kernel) in cases:
        torch_us, triton_us = (_device_us(fn, device, rep_ms) for fn in (reference, kernel))
        lines.append(f"| {name} | {torch_us:.1f} | {triton_us:.1f} | {torch_us / triton_us:.1f} |")
    return "\n".join(lines)


def _device_us(fn: Callable[[], object], device: torch.device, rep_ms: float) -> float:
    """Replayed from a CUDA graph; eagerly (its launches timed too) if it cannot be captured."""
    try:
        return replay_us([fn], device, rep_ms=rep_ms)
    except RuntimeError as error:  # a capture the call does not survive
        print(f"not captured, timed eagerly: {error}")
        return median_us(fn, device, rep_ms=rep_ms)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the markdown tables to this path")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check it runs")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    vocabs = (50,) if args.smoke else VOCABS
    draws = ((1, 1), (2, 4)) if args.smoke else DRAWS
    softmax_rows = (1, 3) if args.smoke else SOFTMAX_ROWS
    walk_batches, walk_blocks = ((2,), (16,)) if args.smoke else (WALK_BATCHES, WALK_BLOCKS)
    rep_ms = 1.0 if args.smoke else 30.0
    parts = [f"# Sampled steps' kernels vs torch ({device}{', smoke' if args.smoke else ''})"]
    for vocab in vocabs:
        draw_cases = [(f"bs {bs}, k {k}", draw_case(bs, k, vocab, device)) for bs, k in draws]
        parts.append(table(f"Draws, vocabulary {vocab}", draw_cases, device, rep_ms))
        softmax_cases = [
            (f"{rows} rows", softmax_case(rows, vocab, device)) for rows in softmax_rows
        ]
        parts.append(table(f"Tempered softmax, vocabulary {vocab}", softmax_cases, device, rep_ms))
        walk_cases = [
            (f"bs {bs}, block {block}, {walk} walk", walk_case(bs, vocab, block, walk, device))
            for bs in walk_batches
            for block in walk_blocks
            for walk in ("tree", "chain")
        ]
        parts.append(
            table(f"A drawn chain S3's walk, vocabulary {vocab}", walk_cases, device, rep_ms)
        )
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
