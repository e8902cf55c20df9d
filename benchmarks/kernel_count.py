"""Benchmark: kernels a decode step launches per decoder layer, fused kernels on and off
(``python -m benchmarks.fused_kernels --count-kernels``).

It builds Llama-8B-shaped targets of 2 and 4 layers (random bf16 weights, a 32 000-token
vocabulary), runs one decode forward of a batch (8 requests, 128 tokens of prefix each) through a
``TargetModelRunner`` with the Triton attention backend under the CUDA profiler, and reports
kernels per decoder layer = (kernels(4 layers) − kernels(2 layers)) / 2, with the per-layer
kernels by name.
"""

from __future__ import annotations

from collections import Counter

import torch

from benchmarks.llama_shapes import Shape
from benchmarks.timing import kernel_names
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models.config import LlamaConfig, RopeConfig
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.domain.batch import ForwardBatch, ForwardMode


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
    names = kernel_names(lambda: runner.forward(batch), device)
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
