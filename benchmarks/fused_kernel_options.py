"""Benchmark: the fused kernels' launch options on Llama-3.1-8B shapes — ``rope_kv_store`` per
heads-per-program (``fused_kernels --rope-heads``) and the RMSNorm kernels per warps per row
(``fused_kernels --norm-warps``) — each replayed from a CUDA graph of 16 calls, µs per call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from benchmarks.llama_shapes import Shape
from benchmarks.timing import replay_us
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.rotary import RotaryEmbedding

ROPE_HEADS = (1, 2, 4, 8, 16, 64)
NORM_WARPS = (2, 4, 8, 16)


def option_row(
    label: str, calls: list[Callable[[], object]], options: tuple[int, ...], device: torch.device
) -> str:
    """``| label | µs of each call, replayed 16 times from a CUDA graph | best option |``."""
    times = [replay_us([call] * 16, device) for call in calls]
    cells = " | ".join(f"{t:.2f}" for t in times)
    line = f"| {label} | {cells} | {options[times.index(min(times))]} |"
    print(line, flush=True)
    return line


def norm_warps_table(shape: Shape, tokens: tuple[int, ...], device: torch.device) -> str:
    """``rmsnorm`` and ``fused_add_rmsnorm`` per warps per row, replayed from a CUDA graph (16
    calls): µs per call."""
    dtype = torch.bfloat16
    warps_list = NORM_WARPS[:2] if device.type == "cpu" else NORM_WARPS
    lines = [
        "| kernel | tokens | " + " | ".join(f"{w} warps µs" for w in warps_list) + " | best |",
        "|---|---:|" + "---:|" * len(warps_list) + "---|",
    ]
    for n in tokens:
        generator = torch.Generator().manual_seed(n)
        x = torch.randn(n, shape.hidden, generator=generator).to(device, dtype)
        residual = torch.randn(n, shape.hidden, generator=generator).to(device, dtype)
        weight = torch.randn(shape.hidden, generator=generator).to(device, dtype)
        calls: dict[str, list[Callable[[], object]]] = {
            "rmsnorm": [partial(rmsnorm, x, weight, 1e-5, num_warps=w) for w in warps_list],
            "add+rmsnorm": [
                partial(fused_add_rmsnorm, x, residual, weight, 1e-5, num_warps=w)
                for w in warps_list
            ],
        }
        for name, per_warps in calls.items():
            lines.append(option_row(f"{name} | {n}", per_warps, warps_list, device))
    return "\n".join(lines)


def rope_heads_table(shape: Shape, tokens: tuple[int, ...], device: torch.device) -> str:
    """``rope_kv_store`` per heads-per-program, replayed from a CUDA graph (16 calls), with and
    without a folded norm's statistic: µs per call."""
    dtype = torch.bfloat16
    heads_list = ROPE_HEADS[:2] if device.type == "cpu" else ROPE_HEADS
    lines = [
        "| tokens | norm | " + " | ".join(f"{h} heads µs" for h in heads_list) + " | best |",
        "|---:|---|" + "---:|" * len(heads_list) + "---|",
    ]
    for n in tokens:
        generator = torch.Generator().manual_seed(n)
        q = torch.randn(n, shape.q_heads, shape.head_dim, generator=generator).to(device, dtype)
        k = torch.randn(n, shape.kv_heads, shape.head_dim, generator=generator).to(device, dtype)
        v = torch.randn(n, shape.kv_heads, shape.head_dim, generator=generator).to(device, dtype)
        stream = torch.randn(n, shape.hidden, generator=generator).to(device, dtype)
        positions = torch.randint(0, 4096, (n,), generator=generator).to(device)
        rope = RotaryEmbedding(RopeConfig(theta=500000.0), shape.head_dim).to(device)(
            positions, dtype
        )
        pool = MHAKVPool(
            shape.slots, 1, shape.kv_heads, shape.head_dim, shape.head_dim, dtype, device,
            TorchRowMover(),
        )  # fmt: skip
        loc = (torch.randperm(shape.slots, generator=generator)[:n] + 1).to(device)
        buffers = pool.get_key_buffer(0), pool.get_value_buffer(0)
        for norm_of in (None, stream):
            calls: list[Callable[[], object]] = [
                partial(
                    rope_kv_store, q, k, v, rope.cos, rope.sin, loc, *buffers, norm_of, 1e-5, heads
                )
                for heads in heads_list
            ]
            label = f"{n} | {'yes' if norm_of is not None else 'no'}"
            lines.append(option_row(label, calls, heads_list, device))
    return "\n".join(lines)
