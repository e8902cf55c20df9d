"""Benchmark: the domain core per decode step — build_tree, verify_tree_greedy, compaction.

For bs in {1, 16, 64, 256} and (k, S, N) in {(1,5,6), (4,5,8), (8,5,64), (16,5,64)} it times,
per call, ``build_tree`` (FULL_MASK with ``seq_lens_sum`` given, and QLEN_ONLY),
``verify_tree_greedy``, compaction (``accepted_move_plan`` + ``compact_to_front`` of predict),
``compact_to_front`` of the (bs·N, H) bf16 hidden states, and all of them in a row (FULL_MASK).
Inputs come from the real beam (``select_top_k_tokens`` S times, ``organize_draft_results``),
built once outside the timing; the target agrees with each node's first child, so the
top-ranked path is accepted to full depth.
Times are medians in µs per call (``benchmarks.timing.median_us``: CUDA events without an L2
flush on the GPU, ``time.perf_counter`` on the CPU). ``--sync-debug`` runs every timed call under
``torch.cuda.set_sync_debug_mode("error")``: a host synchronisation inside any of them raises, so
a finished table shows the path is free of them.

    python -m benchmarks.domain_ops --sync-debug --out domain_ops.md
    python -m benchmarks.domain_ops --devices cpu --rep-ms 20   # CPU only

Needs only torch (it imports ``eagletree.domain`` alone).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.printed_table import PrintedTable
from benchmarks.timing import median_us
from eagletree.domain.compaction import accepted_move_plan, compact_to_front
from eagletree.domain.tree import (
    DraftTree,
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.domain.verify import VerifyResult, verify_tree_greedy

BATCH_SIZES = (1, 16, 64, 256)
TREE_SHAPES = ((1, 5, 6), (4, 5, 8), (8, 5, 64), (16, 5, 64))  # (k, S, N)
VOCAB = 32_000


@dataclass(frozen=True)
class StepInputs:
    """Everything build_tree, verify and compaction read, prepared outside the timing."""

    k: int
    steps: int
    n: int
    seq_lens_sum: int
    verified_id: torch.Tensor  # (bs,)
    parent_list: torch.Tensor  # (bs, (S−1)k + 1)
    top_scores_index: torch.Tensor  # (bs, N−1)
    draft_tokens: torch.Tensor  # (bs, N−1)
    seq_lens: torch.Tensor  # (bs,)
    target_predict: torch.Tensor  # (bs, N)
    verify_slots: torch.Tensor  # (bs·N,)
    hidden: torch.Tensor  # (bs·N, H)


def prepare(
    bs: int, k: int, steps: int, n: int, seq_len: int, hidden_size: int, device: torch.device
) -> StepInputs:
    gen = torch.Generator().manual_seed(bs * 1000 + k * 10 + n)
    hidden_states = torch.randn((bs, 8), generator=gen)
    scores = None
    infos = []
    for i in range(steps):
        rows = bs if i == 0 else bs * k
        topk_p = torch.rand((rows, k), generator=gen).sort(dim=1, descending=True).values
        topk_p = topk_p / topk_p.sum(dim=1, keepdim=True)
        topk_index = torch.randint(VOCAB, (rows, k), generator=gen)
        beam = select_top_k_tokens(i, topk_p, topk_index, hidden_states, scores, k)
        hidden_states, scores = beam.hidden_states, beam.scores
        infos.append(beam.tree_info)
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        [t[0] for t in infos], [t[1] for t in infos], [t[2] for t in infos], n
    )
    verified_id = torch.randint(VOCAB, (bs,), generator=gen)
    seq_lens = torch.randint(seq_len // 2, seq_len + 1, (bs,), generator=gen)
    tree = build_tree(
        verified_id, parent_list, top_scores_index, draft_tokens, seq_lens, k, steps, n,
        TreeMaskMode.QLEN_ONLY,
    )  # fmt: skip
    candidates = tree.draft_tokens.view(bs, n)
    first_child = tree.retrieve_next_token.clamp(min=0)
    target = torch.where(
        tree.retrieve_next_token >= 0,
        torch.gather(candidates, 1, first_child),
        torch.randint(VOCAB, (bs, n), generator=gen),
    )
    return StepInputs(
        k=k,
        steps=steps,
        n=n,
        seq_lens_sum=int(seq_lens.sum()),
        verified_id=verified_id.to(device),
        parent_list=parent_list.to(device),
        top_scores_index=top_scores_index.to(device),
        draft_tokens=draft_tokens.to(device),
        seq_lens=seq_lens.to(device),
        target_predict=target.to(device),
        verify_slots=torch.arange(1, bs * n + 1, device=device),
        hidden=torch.randn((bs * n, hidden_size), generator=gen).to(device, torch.bfloat16),
    )


def run_build(x: StepInputs, mode: TreeMaskMode) -> DraftTree:
    return build_tree(
        x.verified_id, x.parent_list, x.top_scores_index, x.draft_tokens, x.seq_lens,
        x.k, x.steps, x.n, mode, seq_lens_sum=x.seq_lens_sum,
    )  # fmt: skip


def run_verify(x: StepInputs, tree: DraftTree) -> VerifyResult:
    bs = x.verified_id.shape[0]
    return verify_tree_greedy(
        tree.draft_tokens.view(bs, x.n),
        tree.retrieve_index,
        tree.retrieve_next_token,
        tree.retrieve_next_sibling,
        x.target_predict,
        x.steps,
    )


def run_compaction(x: StepInputs, result: VerifyResult) -> tuple[torch.Tensor, ...]:
    tgt, src = accepted_move_plan(result.accept_index, result.accept_length, x.verify_slots, x.n)
    return tgt, src, compact_to_front(result.predict, result.accept_index, x.n)


def run_compact_hidden(x: StepInputs, result: VerifyResult) -> torch.Tensor:
    return compact_to_front(x.hidden, result.accept_index, x.n)


def run_step(x: StepInputs) -> tuple[torch.Tensor, ...]:
    tree = run_build(x, TreeMaskMode.FULL_MASK)
    result = run_verify(x, tree)
    return (*run_compaction(x, result), run_compact_hidden(x, result))


COLUMNS = (
    "build FULL",
    "build QLEN",
    "verify greedy",
    "plan + compact predict",
    "compact hidden",
    "all (FULL)",
)


def benchmark_row(
    device: torch.device, bs: int, shape: tuple[int, int, int], args: argparse.Namespace
) -> list[float]:
    k, steps, n = shape
    x = prepare(bs, k, steps, n, args.seq_len, args.hidden_size, device)
    tree = run_build(x, TreeMaskMode.FULL_MASK)
    result = run_verify(x, tree)

    def timed(fn: Callable[[], object]) -> float:
        # no L2 flush: a step's small tensors stay in L2 from one operation to the next
        return median_us(fn, device, rep_ms=args.rep_ms, flush_l2=False, sync_debug=args.sync_debug)

    return [
        timed(lambda: run_build(x, TreeMaskMode.FULL_MASK)),
        timed(lambda: run_build(x, TreeMaskMode.QLEN_ONLY)),
        timed(lambda: run_verify(x, tree)),
        timed(lambda: run_compaction(x, result)),
        timed(lambda: run_compact_hidden(x, result)),
        timed(lambda: run_step(x)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    parser.add_argument("--devices", nargs="+", default=default_devices)
    parser.add_argument("--bs", nargs="+", type=int, default=list(BATCH_SIZES))
    parser.add_argument("--seq-len", type=int, default=512, help="largest committed length L_b")
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed span per cell")
    parser.add_argument("--sync-debug", action="store_true", help="raise on any host sync")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()

    table = PrintedTable(
        f"domain ops, median µs per call (L_b in [{args.seq_len // 2}, {args.seq_len}], "
        f"H = {args.hidden_size}, sync-debug = {'error' if args.sync_debug else 'off'}, "
        f"torch {torch.__version__})",
        "",
        "| device | bs | k | S | N | " + " | ".join(COLUMNS) + " |",
        "|---" * (5 + len(COLUMNS)) + "|",
    )
    for name in args.devices:
        device = torch.device(name)
        label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        for shape in TREE_SHAPES:
            for bs in args.bs:
                times = benchmark_row(device, bs, shape, args)
                k, steps, n = shape
                cells = " | ".join(f"{t:.1f}" for t in times)
                table.add(f"| {label} | {bs} | {k} | {steps} | {n} | {cells} |")
    if args.sync_debug and "cuda" in args.devices:
        table.add("", "Every timed CUDA call ran under set_sync_debug_mode('error'): no host sync.")
    table.write(args.out)


if __name__ == "__main__":
    main()
