"""Benchmarks: one layer of Llama-3.1-8B attention on a KV pool — the shapes, the scattered
slots, the draft trees and the backends that ``attention`` and ``attention_sweeps`` time.

32 q heads, 8 kv heads, head_dim 128, bf16; each request's prefix sits on randomly scattered
slots, as a long-lived allocator leaves them; a verify's tree is a random draft tree of N nodes
from the real beam (``select_top_k_tokens``, ``organize_draft_results``, ``build_tree``).
"""

from __future__ import annotations

import math
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


def build_backends(
    setup: Setup, names: list[str], triton_options: dict[str, int]
) -> dict[str, AttentionBackend]:
    """The named backends (torch, triton, flash) over the setup's pool; torch only where its
    dense fp32 scores fit ``TORCH_SCORE_BUDGET``, flash only on CUDA."""
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
        elif name == "flash" and setup.pool.geometry.device.type == "cuda":
            backends[name] = FlashAttentionBackend(setup.pool, setup.table)
    return backends
