"""Benchmark: attention backends on Llama-3.1-8B shapes — time and KV bandwidth against a copy.

One layer of 32 q heads, 8 kv heads, head_dim 128, bf16, prefixes on randomly scattered slots.
Rows: target verify (a random draft tree of N nodes, FULL_MASK) for bs in {1, 8, 32, 64},
prefix in {1k, 4k, 16k}, N in {8, 64}; the causal EXTEND of the same shape (N new tokens per
request on the same prefix), whose time is the denominator of the tree-mask overhead ratio; and
decode (one token per request). KV bytes = bs · (prefix + new) · kv_heads · (head_dim +
v_head_dim) · 2 B read once; bandwidth = KV bytes / median time, shown as a share of the
device-to-device copy bandwidth (bytes read + written) measured in the same run. Times are
medians of ``triton.testing.do_bench`` (L2 flushed) of ``forward(save_kv=False)`` after one
``init_forward_metadata``; ``err`` is the max |o − o_triton| of the row's output.

    PYTHONPATH=$PWD python3 benchmarks/attention.py --out attention.md     # full table, H200
    PYTHONPATH=$PWD python3 benchmarks/attention.py --quick --tune         # target point + tiles
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/attention.py --smoke   # CPU: runs?
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.domain.attention_layer import AttentionLayer
from eagletree.domain.batch import ForwardBatch, ForwardMode, TargetVerifySpec
from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.ports.attention import AttentionBackend

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
TREE_SHAPE = {8: (4, 5), 64: (8, 5)}  # N -> (topk, num_steps), typical tree configs
TORCH_SCORE_BUDGET = 2 << 30  # skip the dense reference when its fp32 scores exceed this


@dataclass(frozen=True)
class Point:
    mode: ForwardMode
    bs: int
    prefix: int
    new: int  # new tokens per request


@dataclass
class Setup:
    pool: MHAKVPool
    table: TensorReqToTokenPool
    batch: ForwardBatch
    q: torch.Tensor
    layer: AttentionLayer

    @property
    def kv_bytes(self) -> int:
        keys = int(self.batch.seq_lens_sum or 0) + self.batch.num_tokens
        return keys * KV_HEADS * (HEAD_DIM + HEAD_DIM) * 2


def random_tree_spec(
    bs: int, n: int, prefix: int, device: torch.device, gen: torch.Generator
) -> tuple[TargetVerifySpec, torch.Tensor]:
    topk, steps = TREE_SHAPE.get(n, (2, max(1, n - 1)))
    hidden = torch.zeros(bs, 1, device=device)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for step in range(steps):
        rows = bs if step == 0 else bs * topk
        probs = torch.rand(rows, topk, generator=gen).to(device) + 1e-3
        probs = torch.sort(probs / probs.sum(-1, keepdim=True), -1, descending=True).values
        tokens = torch.randint(0, 32000, (rows, topk), generator=gen).to(device)
        beam = select_top_k_tokens(step, probs, tokens, hidden, scores, topk)
        hidden, scores = beam.hidden_states, beam.scores
        score_list.append(beam.tree_info[0])
        token_list.append(beam.tree_info[1])
        parents_list.append(beam.tree_info[2])
    parent_list, top_index, draft = organize_draft_results(score_list, token_list, parents_list, n)
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64, device=device)
    roots = torch.zeros(bs, dtype=torch.int64, device=device)
    tree = build_tree(
        roots,
        parent_list,
        top_index,
        draft,
        seq_lens,
        topk,
        steps,
        n,
        TreeMaskMode.FULL_MASK,
        seq_lens_sum=bs * prefix,
    )
    block = torch.full((bs,), n * (prefix + n), dtype=torch.int64, device=device)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), block.cumsum(0)])
    return TargetVerifySpec(n, tree.tree_mask, TreeMaskMode.FULL_MASK, indptr), tree.positions


def make_setup(point: Point, device: torch.device, seed: int = 0) -> Setup:
    gen = torch.Generator().manual_seed(seed)
    bs, prefix, new = point.bs, point.prefix, point.new
    num_tokens = bs * new
    size = bs * (prefix + new) + 1
    pool = MHAKVPool(size, 1, KV_HEADS, HEAD_DIM, HEAD_DIM, torch.bfloat16, device, TorchRowMover())
    for buf in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
        buf.normal_()  # random rows, never zeros
    slots = torch.randperm(size, device=device) + 1  # scattered, as a long-lived allocator leaves
    table = TensorReqToTokenPool(bs, prefix + new + 8, device)
    prefix_slots = slots[: bs * prefix].view(bs, prefix)
    table.req_to_token[:, :prefix] = prefix_slots.to(torch.int32)
    out_cache_loc = slots[bs * prefix : bs * prefix + num_tokens]
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64, device=device)
    positions = (torch.arange(new, device=device) + prefix).repeat(bs)
    extend_lens = None
    spec = None
    if point.mode is ForwardMode.TARGET_VERIFY:
        spec, positions = random_tree_spec(bs, new, prefix, device, gen)
    elif point.mode is ForwardMode.EXTEND:
        extend_lens = torch.full((bs,), new, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        mode=point.mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions,
        seq_lens=seq_lens,
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
        out_cache_loc=out_cache_loc,
        extend_lens=extend_lens,
        seq_lens_cpu=torch.full((bs,), prefix, dtype=torch.int64),
        seq_lens_sum=bs * prefix,
        extend_lens_cpu=None if extend_lens is None else torch.full((bs,), new),
        spec=spec,
    )
    q = torch.randn(num_tokens, Q_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
    layer = AttentionLayer(0, Q_HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, 1.0 / math.sqrt(HEAD_DIM))
    return Setup(pool, table, batch, q, layer)


def median_ms(fn: Callable[[], object], device: torch.device, rep_ms: int) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy (64 KiB on CPU)."""
    numel = (1 << 30) // 4 if device.type == "cuda" else 1 << 14
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, 200)
    return 2 * numel * 4 / (ms * 1e-3)


def build_backends(
    setup: Setup, names: list[str], triton_options: dict[str, int]
) -> dict[str, AttentionBackend]:
    backends: dict[str, AttentionBackend] = {}
    for name in names:
        if name == "torch":
            new = setup.batch.num_tokens // max(setup.batch.batch_size, 1)
            prefix = int(setup.batch.seq_lens_sum or 0) // max(setup.batch.batch_size, 1)
            scores = setup.batch.batch_size * Q_HEADS * new * (prefix + new) * 4
            if scores <= TORCH_SCORE_BUDGET:
                backends[name] = TorchAttentionBackend(setup.pool, setup.table)
        elif name == "triton":
            backends[name] = TritonAttentionBackend(setup.pool, setup.table, **triton_options)
        elif name == "flash" and setup.pool.device.type == "cuda":
            backends[name] = FlashAttentionBackend(setup.pool, setup.table)
    return backends


def measure(
    setup: Setup, backend: AttentionBackend, device: torch.device, rep_ms: int
) -> tuple[float, torch.Tensor]:
    batch, q, layer = setup.batch, setup.q, setup.layer
    backend.init_forward_metadata(batch)
    out = backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False)
    ms = median_ms(
        lambda: backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], layer, batch, save_kv=False),
        device,
        rep_ms,
    )
    return ms, out.float()


def points(quick: bool, smoke: bool) -> list[Point]:
    if smoke:
        sizes, prefixes, widths = [1, 2], [40], [4]
    elif quick:
        sizes, prefixes, widths = [1, 32], [4096], [8]
    else:
        sizes, prefixes, widths = [1, 8, 32, 64], [1024, 4096, 16384], [8, 64]
    rows = []
    for prefix in prefixes:
        for bs in sizes:
            for n in widths:
                rows.append(Point(ForwardMode.EXTEND, bs, prefix, n))
                rows.append(Point(ForwardMode.TARGET_VERIFY, bs, prefix, n))
            rows.append(Point(ForwardMode.DECODE, bs, prefix, 1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bs 1 and 32, prefix 4k, N 8 only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--tune", action="store_true", help="also sweep Triton tile options")
    parser.add_argument("--backends", default="torch,triton,flash")
    parser.add_argument("--rep-ms", type=int, default=60)
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = args.backends.split(",")
    copy_bw = copy_bandwidth(device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [
        f"device: {device_name}; copy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s",
        "",
        "| mode | bs | prefix | new | backend | time µs | KV GB/s | % copy | verify/extend | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    extend_ms: dict[tuple[int, int, int, str], float] = {}
    for point in points(args.quick, args.smoke):
        setup = make_setup(point, device)
        results: dict[str, tuple[float, torch.Tensor]] = {}
        for name, backend in build_backends(setup, names, {}).items():
            results[name] = measure(setup, backend, device, args.rep_ms)
        anchor = results["triton"][1] if "triton" in results else None
        for name, (ms, out) in results.items():
            bandwidth = setup.kv_bytes / (ms * 1e-3)
            key = (point.bs, point.prefix, point.new, name)
            ratio = ""
            if point.mode is ForwardMode.EXTEND:
                extend_ms[key] = ms
            elif point.mode is ForwardMode.TARGET_VERIFY and key in extend_ms:
                ratio = f"{ms / extend_ms[key]:.2f}"
            err = f"{(out - anchor).abs().max().item():.1e}" if anchor is not None else ""
            line = (
                f"| {point.mode.name.lower()} | {point.bs} | {point.prefix} | {point.new} | {name} "
                f"| {ms * 1e3:.1f} | {bandwidth / 1e9:.0f} | {100 * bandwidth / copy_bw:.0f} "
                f"| {ratio} | {err} |"
            )
            lines.append(line)
            print(line, flush=True)
        del setup, results
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.tune:
        lines += tune(device, copy_bw, args.rep_ms, args.smoke)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


def tune(device: torch.device, copy_bw: float, rep_ms: int, smoke: bool) -> list[str]:
    """Triton tile options at the target point (bs 32, prefix 4k, N 8) and at decode."""
    lines = ["", "| triton options | mode | time µs | % copy |", "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    bs, prefix = (2, 40) if smoke else (32, 4096)
    for point in (
        Point(ForwardMode.TARGET_VERIFY, bs, prefix, 8),
        Point(ForwardMode.EXTEND, bs, prefix, 8),
        Point(ForwardMode.DECODE, bs, prefix, 1),
    ):
        setup = make_setup(point, device)
        for block_n in (32, 64, 128):
            for num_stages in (2, 3, 4):
                for num_warps in (4, 8):
                    options = {"block_n": block_n, "num_stages": num_stages, "num_warps": num_warps}
                    backend = build_backends(setup, ["triton"], options)["triton"]
                    ms, _ = measure(setup, backend, device, rep_ms)
                    pct = 100 * setup.kv_bytes / (ms * 1e-3) / copy_bw
                    line = f"| {options} | {point.mode.name.lower()} | {ms * 1e3:.1f} | {pct:.0f} |"
                    lines.append(line)
                    print(line, flush=True)
        del setup
    return lines


if __name__ == "__main__":
    main()
