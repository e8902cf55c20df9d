"""Benchmark: the models' fused Triton kernels against their torch reference code (and, by
flag, their launch options and the kernels a decode step launches per decoder layer).

Shapes are Llama-3.1-8B's: hidden 4096, intermediate 14336, 32 q heads and 8 kv heads of 128,
bf16, for 1, 8, 32 and 256 tokens. Rows of the timing table:

* "rmsnorm": ``RMSNorm`` (torch: fp32 statistics, cast, weight) vs ``rmsnorm``;
* "add+rmsnorm": ``residual + x`` then ``RMSNorm`` vs ``fused_add_rmsnorm`` (in place);
* "silu*mul": ``silu(gate) * up`` over the merged gate/up output vs ``silu_and_mul``;
* "rope+kv store": ``RopeTables.rotate`` on q and k then ``MHAKVPool.set_kv_buffer`` vs
  ``rope_kv_store`` (a bf16 pool of 65 536 slots, the new tokens at scattered slots);
* "mla prologue" (DeepSeek-V3 shapes: 128 heads, latent 512, rope 64, interleaved):
  ``kv_a_layernorm``, the rotations of q_rope and k_rope, the row ``cat`` and
  ``MLAKVPool.set_kv_buffer`` vs ``mla_rope_kv_store``.

"µs" is ``benchmarks.timing.median_us`` (per-call CUDA events, L2 flushed before each call,
so small calls measure their launch too); "launches" counts kernels with the CUDA profiler.
Times are printed, never asserted.

``--rope-heads`` times ``rope_kv_store`` per heads-per-program (1–64), replayed from a CUDA
graph, for the same token counts, with and without a folded norm; ``--norm-warps`` times the
RMSNorm kernels per warps per row the same way (``fused_kernel_options``). ``--count-kernels``
counts the kernels of a decode step per decoder layer with the fused kernels on and off
(``kernel_count``).

    python -m benchmarks.fused_kernels --out fused_kernels.md [--count-kernels]
    TRITON_INTERPRET=1 python -m benchmarks.fused_kernels --smoke --count-kernels
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from benchmarks.fused_kernel_options import norm_warps_table, rope_heads_table
from benchmarks.kernel_count import count_table
from benchmarks.llama_shapes import LLAMA_8B, SMOKE, Shape
from benchmarks.timing import kernel_names, median_us
from eagletree.adapters.kernels.triton.mla_rope_kv_store import mla_rope_kv_store
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import RopeConfig
from eagletree.adapters.models.layers import RMSNorm
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding

TOKENS = (1, 8, 32, 256)
MLA_HEADS, MLA_RANK, MLA_ROPE = 128, 512, 64  # DeepSeek-V3
Case = tuple[Callable[[], object], Callable[[], object]]  # (torch reference, Triton kernel)


def cases(shape: Shape, tokens: int, device: torch.device) -> dict[str, Case]:
    dtype = torch.bfloat16
    generator = torch.Generator().manual_seed(tokens)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(device, dtype)

    norm = RMSNorm(shape.hidden, 1e-5).to(device, dtype)
    x, residual = randn(tokens, shape.hidden), randn(tokens, shape.hidden)
    gate_up = randn(tokens, 2 * shape.intermediate)
    q_width, kv_width = shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim
    qkv = randn(tokens, q_width + 2 * kv_width)
    q, k, v = torch.split(qkv, [q_width, kv_width, kv_width], dim=-1)
    q = q.view(tokens, shape.q_heads, shape.head_dim)
    k = k.view(tokens, shape.kv_heads, shape.head_dim)
    v = v.view(tokens, shape.kv_heads, shape.head_dim)
    positions = torch.randint(0, 4096, (tokens,), generator=generator).to(device)
    rotary = RotaryEmbedding(RopeConfig(theta=500000.0), shape.head_dim).to(device)
    rope: RopeTables = rotary(positions, dtype)
    pool = MHAKVPool(
        shape.slots, 1, shape.kv_heads, shape.head_dim, shape.head_dim, dtype, device,
        TorchRowMover(),
    )  # fmt: skip
    loc = (torch.randperm(shape.slots, generator=generator)[:tokens] + 1).to(device)
    k_buf, v_buf = pool.get_key_buffer(0), pool.get_value_buffer(0)

    def torch_silu() -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        out: torch.Tensor = torch.nn.functional.silu(gate) * up
        return out

    def torch_rope() -> torch.Tensor:
        pool.set_kv_buffer(0, loc, rope.rotate(k), v)
        return rope.rotate(q)

    mla_q = randn(tokens, MLA_HEADS, 128 + MLA_ROPE)[..., 128:]
    compressed = randn(tokens, MLA_RANK + MLA_ROPE)
    latent, k_rope = compressed[:, :MLA_RANK], compressed[:, MLA_RANK:]
    latent_norm = RMSNorm(MLA_RANK, 1e-6).to(device, dtype)
    mla_rotary = RotaryEmbedding(RopeConfig(theta=10000.0), MLA_ROPE, interleaved=True)
    mla_rope: RopeTables = mla_rotary.to(device)(positions, dtype)
    mla_pool = MLAKVPool(shape.slots, 1, MLA_RANK, MLA_ROPE, dtype, device, TorchRowMover())

    def torch_mla() -> torch.Tensor:
        row = torch.cat((latent_norm(latent)[:, None], mla_rope.rotate(k_rope[:, None])), -1)
        mla_pool.set_kv_buffer(0, loc, row)
        return mla_rope.rotate(mla_q)

    def triton_mla() -> torch.Tensor:
        return mla_rope_kv_store(
            mla_q, latent, k_rope, latent_norm.weight, latent_norm.eps, mla_rope.cos,
            mla_rope.sin, True, loc, mla_pool.get_kv_buffer(0),
        )  # fmt: skip

    return {
        "rmsnorm": (lambda: norm(x), lambda: rmsnorm(x, norm.weight, norm.eps)),
        "add+rmsnorm": (
            lambda: norm(residual + x),
            lambda: fused_add_rmsnorm(x, residual, norm.weight, norm.eps),
        ),
        "silu*mul": (torch_silu, lambda: silu_and_mul(gate_up)),
        "rope+kv store": (
            torch_rope,
            lambda: rope_kv_store(q, k, v, rope.cos, rope.sin, loc, k_buf, v_buf),
        ),
        "mla prologue": (torch_mla, triton_mla),
    }


def timing_table(shape: Shape, tokens: tuple[int, ...], device: torch.device) -> str:
    lines = [
        "| kernel | tokens | torch µs | triton µs | speed-up | launches torch → triton |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for n in tokens:
        for name, (reference, kernel) in cases(shape, n, device).items():
            torch_us = median_us(reference, device, rep_ms=200)
            triton_us = median_us(kernel, device, rep_ms=200)
            launches = [kernel_names(fn, device) for fn in (reference, kernel)]
            counted = (
                "—" if launches[0] is None or launches[1] is None
                else f"{len(launches[0])} → {len(launches[1])}"
            )  # fmt: skip
            lines.append(
                f"| {name} | {n} | {torch_us:.1f} | {triton_us:.1f} |"
                f" {torch_us / triton_us:.2f}× | {counted} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the markdown tables to this path")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check it runs")
    parser.add_argument("--count-kernels", action="store_true", help="kernels per decoder layer")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing table")
    parser.add_argument(
        "--rope-heads", action="store_true", help="rope_kv_store per heads-per-program"
    )
    parser.add_argument("--norm-warps", action="store_true", help="the RMSNorms per warps")
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = SMOKE if args.smoke else LLAMA_8B
    tokens = (1, 13) if args.smoke else TOKENS
    parts = [f"# Fused kernels vs torch ({device}, {'smoke' if args.smoke else 'Llama-3.1-8B'})"]
    if not args.no_timing:
        parts.append(timing_table(shape, tokens, device))
    if args.rope_heads:
        parts.append(rope_heads_table(shape, tokens, device))
    if args.norm_warps:
        parts.append(norm_warps_table(shape, tokens, device))
    if args.count_kernels:
        vocab, prefix = (96, 5) if args.smoke else (32_000, 128)
        parts.append(count_table(shape, device, vocab, prefix))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
