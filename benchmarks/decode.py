"""Benchmark: non-speculative decode, the eagletree engine vs transformers' generate, one run.

Both decode the same random checkpoint (``write_random_checkpoint``, the weights
`eagletree init-random` writes; Llama-3.1-8B dimensions with ``--preset llama3-8b``) greedily
for ``--new-tokens`` tokens after a ``--prompt-len`` prompt, at each batch size. The engine is
built without the settings container (only torch, transformers and safetensors are needed).
Rows: wall time of the whole generate (prefill included, after a warm-up), tokens per second,
milliseconds per decode step, the share of the memory roofline (all weights read once per step
at ``--bandwidth-tbs``), and how much of transformers' output the engine reproduced.

    PYTHONPATH=$PWD python3 benchmarks/decode.py --preset llama3-8b --out /tmp/llama3-8b
    PYTHONPATH=$PWD python3 benchmarks/decode.py --preset tiny --device cpu \
        --attention torch --new-tokens 8 --batch-sizes 1 2        # CPU: does it run?
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.random_checkpoint import PRESETS, write_random_checkpoint
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.adapters.models.stack import MHALayout
from eagletree.app.engine import Engine
from eagletree.ports.attention import AttentionBackend


def checkpoint(out: Path, preset: str, device: str) -> Path:
    """The target directory under ``out``, written (bf16, seed 0) unless already there."""
    target = out / "target"
    if not (target / "config.json").is_file():
        print(f"writing a random {preset} checkpoint to {out} ...", flush=True)
        started = time.perf_counter()
        write_random_checkpoint(out, "llama", None, sizes=PRESETS[preset], device=device)
        print(f"  written in {time.perf_counter() - started:.0f} s", flush=True)
    return target


def build_engine(
    path: Path, device: str, attention: str, max_batch_size: int, max_tokens: int
) -> tuple[Engine, int]:
    """The non-speculative engine over our Llama; returns it and the bytes of its weights."""
    model = load_target(path, torch.bfloat16, device)
    layout = model.kv_layout
    assert isinstance(layout, MHALayout)
    pool_size = max_batch_size * (max_tokens + 8)
    kv_pool = MHAKVPool(
        size=pool_size,
        layer_num=layout.layer_num,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        v_head_dim=layout.v_head_dim,
        dtype=torch.bfloat16,
        device=device,
        mover=TorchRowMover(),
    )
    table = TensorReqToTokenPool(max_batch_size, max_tokens + 8, device)
    backend: AttentionBackend
    if attention == "triton":
        from eagletree.adapters.attention.triton_backend import TritonAttentionBackend

        backend = TritonAttentionBackend(kv_pool, table, max_batch_size=max_batch_size)
    else:
        from eagletree.adapters.attention.torch_backend import TorchAttentionBackend

        backend = TorchAttentionBackend(kv_pool, table, max_batch_size=max_batch_size)
    runner = TargetModelRunner(model, kv_pool, table, backend)
    engine = Engine.non_speculative(
        runner,
        DeviceSlotAllocator(pool_size, device),
        max_context_len=max_tokens + 1,
        max_running_requests=max_batch_size,
        eos_token_ids=(),  # random weights: decode the full length, as min_new_tokens does
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return engine, weight_bytes


def timed(device: str, run: Callable[[], list[list[int]]]) -> tuple[float, list[list[int]]]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    outputs = run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started, outputs


def engine_generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    return [r.output_ids for r in engine.generate(prompts, max_new_tokens=new_tokens)]


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    # prompts share one length, so no padding is needed
    ids = torch.tensor(prompts, device=model.device)
    output = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    tokens: list[list[int]] = output[:, ids.shape[1] :].tolist()
    return tokens


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama3-8b", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory (reused)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attention", default="triton", choices=["triton", "torch"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--bandwidth-tbs", type=float, default=4.2, help="HBM bandwidth, TB/s")
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(f"/tmp/eagletree-bench-{args.preset}")
    path = checkpoint(out, args.preset, args.device)

    max_bs, max_tokens = max(args.batch_sizes), args.prompt_len + args.new_tokens
    engine, weight_bytes = build_engine(path, args.device, args.attention, max_bs, max_tokens)
    hf_model = None
    if not args.skip_hf:
        import transformers

        hf_model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        hf_model = hf_model.to(args.device).eval()
    steps_per_s_roof = args.bandwidth_tbs * 1e12 / weight_bytes
    print(
        f"\n{args.preset}: {weight_bytes / 1e9:.1f} GB of weights; roofline "
        f"{steps_per_s_roof:.0f} steps/s at {args.bandwidth_tbs} TB/s; device "
        f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device}; "
        f"attention {args.attention}; prompt {args.prompt_len}, new tokens {args.new_tokens}\n"
    )
    print("| system | bs | time s | tok/s | ms/step | % roofline | same as HF |")
    print("|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    vocab = engine.vocab_size
    for bs in args.batch_sizes:
        prompts = torch.randint(0, vocab, (bs, args.prompt_len), generator=generator).tolist()
        rows: dict[str, tuple[float, list[list[int]]]] = {}
        engine_generate(engine, prompts, 2)  # warm-up: kernels compiled, allocator primed
        rows["eagletree"] = timed(
            args.device, partial(engine_generate, engine, prompts, args.new_tokens)
        )
        if hf_model is not None:
            hf_generate(hf_model, prompts, 2)
            hf_run = partial(hf_generate, hf_model, prompts, args.new_tokens)
            rows["transformers"] = timed(args.device, hf_run)
        reference = rows.get("transformers", (0.0, None))[1]
        for name, (seconds, outputs) in rows.items():
            tokens_per_s = bs * args.new_tokens / seconds
            steps_per_s = args.new_tokens / seconds
            same = "—"
            if reference is not None and name == "eagletree":
                prefix = [common_prefix(a, b) for a, b in zip(outputs, reference, strict=True)]
                same = f"{sum(prefix) / (bs * args.new_tokens):.0%} (prefix)"
            print(
                f"| {name} | {bs} | {seconds:.2f} | {tokens_per_s:.1f} | "
                f"{1000 / steps_per_s:.1f} | {steps_per_s / steps_per_s_roof:.0%} | {same} |",
                flush=True,
            )
    if hf_model is not None:
        print("\n'same as HF': share of generated tokens before the first divergence (bf16).")


if __name__ == "__main__":
    main()
