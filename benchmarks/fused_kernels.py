"""Benchmark: the models' fused Triton kernels against their torch reference code, and the
number of kernels a decode step launches per decoder layer with the kernels on and off.

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

"µs" is the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call,
so small calls measure their launch too); "launches" counts kernels with the CUDA profiler.
Times are printed, never asserted.

``--rope-heads`` times ``rope_kv_store`` per heads-per-program (1–64), replayed from a CUDA
graph, for the same token counts, with and without a folded norm; ``--norm-warps`` times the
RMSNorm kernels per warps per row the same way.

``--count-kernels`` builds Llama-8B-shaped targets of 2 and 4 layers (random bf16 weights, a
32 000-token vocabulary), runs one decode forward of a batch (8 requests, 128 tokens of prefix
each) through a ``TargetModelRunner`` with the Triton attention backend under the profiler, and
reports kernels per decoder layer = (kernels(4 layers) − kernels(2 layers)) / 2 with
``fused_kernels`` on and off, with the per-layer kernels by name.

    PYTHONPATH=$PWD python3 benchmarks/fused_kernels.py --out fused_kernels.md [--count-kernels]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/fused_kernels.py --smoke --count-kernels
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.kernels.triton.mla_rope_kv_store import mla_rope_kv_store
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm, rmsnorm
from eagletree.adapters.kernels.triton.rope_kv_store import rope_kv_store
from eagletree.adapters.kernels.triton.silu_and_mul import silu_and_mul
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import LlamaConfig, RopeConfig
from eagletree.adapters.models.layers import RMSNorm
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.domain.batch import ForwardBatch, ForwardMode


class Shape(NamedTuple):
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    slots: int


LLAMA_8B = Shape(4096, 14336, 32, 8, 128, 65_536)
SMOKE = Shape(80, 112, 4, 2, 16, 64)
TOKENS = (1, 8, 32, 256)
MLA_HEADS, MLA_RANK, MLA_ROPE = 128, 512, 64  # DeepSeek-V3
Case = tuple[Callable[[], object], Callable[[], object]]  # (torch reference, Triton kernel)


def median_us(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        ms: float = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        return ms * 1e3
    start = time.perf_counter()  # the CPU run (smoke, interpreter) only checks that it runs
    fn()
    return (time.perf_counter() - start) * 1e6


def cuda_kernels(fn: Callable[[], object], device: torch.device) -> list[str] | None:
    """Names of the kernels one call launches, from the CUDA profiler (None off CUDA)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type.name == "CUDA"]


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
            torch_us, triton_us = median_us(reference, device), median_us(kernel, device)
            launches = [cuda_kernels(fn, device) for fn in (reference, kernel)]
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


def llama_config(shape: Shape, layers: int, vocab: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=shape.q_heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=500000.0),
        max_position_embeddings=8192,
    )


def decode_kernels(
    shape: Shape, layers: int, fused: bool, device: torch.device, vocab: int, prefix: int
) -> list[str] | None:
    """Kernel names of one decode forward of 8 requests with ``prefix`` tokens each."""
    dtype, bs = torch.bfloat16, 8
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape, layers, vocab), fused_kernels=fused)
    model = model.to(dtype).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    slots = bs * (prefix + 1)
    pool = MHAKVPool(
        slots, layers, shape.kv_heads, shape.head_dim, shape.head_dim, dtype, device,
        TorchRowMover(),
    )  # fmt: skip
    table = TensorReqToTokenPool(bs, prefix + 8, device)
    rows = table.alloc(bs)
    assert rows is not None
    slot_ids = torch.arange(1, slots + 1, device=device).view(bs, prefix + 1)
    table.req_to_token[rows, : prefix + 1] = slot_ids.to(torch.int32)
    runner = TargetModelRunner(model, pool, table, TritonAttentionBackend(pool, table))
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64)
    batch = ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.randint(0, vocab, (bs,), device=device),
        positions=torch.full((bs,), prefix, dtype=torch.int64, device=device),
        seq_lens=seq_lens.to(device),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=device),
        out_cache_loc=slot_ids[:, prefix].contiguous(),
        seq_lens_cpu=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
    )
    names = cuda_kernels(lambda: runner.forward(batch), device)
    if device.type != "cuda":
        runner.forward(batch)  # the smoke run: it runs, nothing to count
    return names


def count_table(shape: Shape, device: torch.device, vocab: int, prefix: int) -> str:
    lines = [
        "| fused_kernels | kernels, 2 layers | kernels, 4 layers | per decoder layer |",
        "|---|---:|---:|---:|",
    ]
    per_layer: dict[bool, Counter[str]] = {}
    for fused in (False, True):
        few = decode_kernels(shape, 2, fused, device, vocab, prefix)
        more = decode_kernels(shape, 4, fused, device, vocab, prefix)
        if few is None or more is None:
            lines.append(f"| {fused} | — | — | — (needs CUDA) |")
            continue
        per_layer[fused] = Counter(more) - Counter(few)
        lines.append(f"| {fused} | {len(few)} | {len(more)} | {(len(more) - len(few)) / 2:g} |")
    for fused, names in per_layer.items():
        lines += ["", f"Kernels of one decoder layer, fused_kernels={fused}:", ""]
        lines += [f"- {count / 2:g} × `{name[:110]}`" for name, count in names.most_common()]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


ROPE_HEADS = (1, 2, 4, 8, 16, 64)
NORM_WARPS = (2, 4, 8, 16)


def option_row(
    label: str, calls: list[Callable[[], object]], options: tuple[int, ...], device: torch.device
) -> str:
    """``| label | µs of each call, replayed 16 times from a CUDA graph | best option |``."""
    from benchmarks.gemm import replay_us

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
