"""Random attention batches for the AttentionBackend contract tests.

A case owns a real KV pool and req_to_token table filled with random rows, a ForwardBatch of one
mode, and the q/k/v of its new tokens. Row contents beyond each request's prefix are stale slot
ids on purpose: a backend must read new tokens through ``out_cache_loc`` and ancestors through
``ancestor_slots``, never through req_to_token past ``L_b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.domain.attention_layer import AttentionLayer
from eagletree.domain.batch import (
    DraftDecodeSpec,
    DraftExtendSpec,
    ForwardBatch,
    ForwardMode,
    TargetVerifySpec,
)
from eagletree.domain.tree import (
    DraftTree,
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)

Pool = MHAKVPool | MLAKVPool


@dataclass(frozen=True)
class Shape:
    """Head layout of one case: MHA/GQA (kv_lora_rank == 0) or MLA (num_kv_heads == 1)."""

    num_q_heads: int
    num_kv_heads: int = 1
    head_dim: int = 64
    v_head_dim: int = 64
    kv_lora_rank: int = 0
    rope_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @staticmethod
    def mla(num_q_heads: int, kv_lora_rank: int, rope_dim: int) -> Shape:
        width = kv_lora_rank + rope_dim
        return Shape(num_q_heads, 1, width, kv_lora_rank, kv_lora_rank, rope_dim)


@dataclass
class AttentionCase:
    pool: Pool
    req_to_token: TensorReqToTokenPool
    layer: AttentionLayer
    batch: ForwardBatch
    q: torch.Tensor  # (num_tokens, H, Dk)
    k: torch.Tensor  # (num_tokens, Hk, Dk)
    v: torch.Tensor | None  # (num_tokens, Hk, Dv); None for MLA
    tree: DraftTree | None

    def expected_buffers(self) -> list[torch.Tensor]:
        """The layer's pool buffers after the new tokens are saved (what save_kv must produce)."""
        loc = self.batch.out_cache_loc
        if isinstance(self.pool, MLAKVPool):
            kv = self.pool.get_kv_buffer(0).clone()
            kv[loc] = self.k.to(kv.dtype).view(-1, 1, kv.shape[-1])
            return [kv]
        assert self.v is not None
        keys = self.pool.get_key_buffer(0).float().clone()
        values = self.pool.get_value_buffer(0).float().clone()
        store = self.pool.store_dtype
        keys[loc] = self.k.to(store).float()
        values[loc] = self.v.to(store).float()
        return [keys, values]

    def pool_buffers(self) -> list[torch.Tensor]:
        if isinstance(self.pool, MLAKVPool):
            return [self.pool.get_kv_buffer(0)]
        return [self.pool.get_key_buffer(0).float(), self.pool.get_value_buffer(0).float()]


def random_tree(
    bs: int,
    topk: int,
    num_steps: int,
    num_draft_tokens: int,
    seq_lens: torch.Tensor,
    mask_mode: TreeMaskMode,
    gen: torch.Generator,
) -> DraftTree:
    """A valid draft tree from random beam steps through the domain's own tree builder."""
    device = seq_lens.device
    hidden = torch.zeros(bs, 1, device=device)
    scores: torch.Tensor | None = None
    score_list, token_list, parents_list = [], [], []
    for step in range(num_steps):
        rows = bs if step == 0 else bs * topk
        probs = torch.rand(rows, topk, generator=gen).to(device) + 1e-3
        probs = torch.sort(probs / probs.sum(-1, keepdim=True), dim=-1, descending=True).values
        tokens = torch.randint(0, 1000, (rows, topk), generator=gen).to(device)
        beam = select_top_k_tokens(step, probs, tokens, hidden, scores, topk)
        hidden, scores = beam.hidden_states, beam.scores
        score_list.append(beam.tree_info[0])
        token_list.append(beam.tree_info[1])
        parents_list.append(beam.tree_info[2])
    parent_list, top_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, num_draft_tokens
    )
    roots = torch.randint(0, 1000, (bs,), generator=gen).to(device)
    return build_tree(
        roots,
        parent_list,
        top_index,
        draft_tokens,
        seq_lens,
        topk,
        num_steps,
        num_draft_tokens,
        mask_mode,
        seq_lens_sum=int(seq_lens.sum()),
    )


def tokens_per_request(mode: ForwardMode, n: int, topk: int) -> int:
    if mode is ForwardMode.DECODE:
        return 1
    if mode is ForwardMode.DRAFT_DECODE:
        return topk
    return n


def make_case(
    mode: ForwardMode,
    shape: Shape,
    prefix_lens: list[int],
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    num_draft_tokens: int = 4,
    topk: int = 2,
    depth: int = 1,
    extend_lens: list[int] | None = None,
    mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
    store_dtype: torch.dtype | None = None,
    gpu_only: bool = False,
    logit_cap: float = 0.0,
) -> AttentionCase:
    """One random batch of ``mode`` over ``len(prefix_lens)`` requests with those prefixes.

    ``depth`` is the number of ancestor slots per branch (DRAFT_DECODE) and, for TARGET_VERIFY,
    the number of beam steps is ``depth + 1``. ``gpu_only`` leaves out every host copy.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    if mode is ForwardMode.EXTEND:
        assert extend_lens is not None and len(extend_lens) == bs
        new_lens = extend_lens
    else:
        new_lens = [tokens_per_request(mode, num_draft_tokens, topk)] * bs
    num_tokens = sum(new_lens)
    num_ancestors = bs * topk * depth if mode is ForwardMode.DRAFT_DECODE else 0

    # distinct random slots for prefixes, new tokens and ancestors; slot 0 stays the dummy
    used = sum(prefix_lens) + num_tokens + num_ancestors
    size = used + 7
    order = (torch.randperm(size, generator=gen) + 1).tolist()
    prefix_slots = [order[sum(prefix_lens[:b]) : sum(prefix_lens[: b + 1])] for b in range(bs)]
    cursor = sum(prefix_lens)
    new_slots = order[cursor : cursor + num_tokens]
    ancestor_slots = order[cursor + num_tokens : cursor + num_tokens + num_ancestors]

    pool: Pool
    if shape.is_mla:
        pool = MLAKVPool(
            size, 1, shape.kv_lora_rank, shape.rope_dim, dtype, device, TorchRowMover()
        )
        pool.get_kv_buffer(0).copy_(_randn(pool.get_kv_buffer(0).shape, gen, dtype, device))
    else:
        pool = MHAKVPool(
            size,
            1,
            shape.num_kv_heads,
            shape.head_dim,
            shape.v_head_dim,
            dtype,
            device,
            TorchRowMover(),
            store_dtype=store_dtype,
        )
        for buf in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
            buf.copy_(_randn(buf.shape, gen, dtype, device).to(buf.dtype))

    row_width = max(p + n for p, n in zip(prefix_lens, new_lens, strict=True)) + 3 if bs else 4
    table = TensorReqToTokenPool(bs + 3, row_width, device)
    rows = (torch.randperm(bs + 3, generator=gen)[:bs]).tolist()
    # stale slot ids everywhere, then the real prefixes
    table.req_to_token.copy_(torch.randint(1, size + 1, table.req_to_token.shape, generator=gen))
    for b, row in enumerate(rows):
        table.req_to_token[row, : prefix_lens[b]] = torch.tensor(prefix_slots[b], dtype=torch.int32)

    head_dim, v_dim = shape.head_dim, shape.v_head_dim
    q = _randn((num_tokens, shape.num_q_heads, head_dim), gen, dtype, device)
    k = _randn((num_tokens, shape.num_kv_heads, head_dim), gen, dtype, device)
    v = (
        None
        if shape.is_mla
        else _randn((num_tokens, shape.num_kv_heads, v_dim), gen, dtype, device)
    )
    layer = AttentionLayer(
        layer_id=0,
        num_q_heads=shape.num_q_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_dim,
        scaling=1.0 / math.sqrt(head_dim),
        is_mla=shape.is_mla,
        logit_cap=logit_cap,
    )

    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
    tree: DraftTree | None = None
    spec: TargetVerifySpec | DraftDecodeSpec | DraftExtendSpec | None = None
    positions = torch.cat(
        [torch.arange(n) + p for p, n in zip(prefix_lens, new_lens, strict=True)]
        + [torch.empty(0, dtype=torch.int64)]
    )
    if mode is ForwardMode.TARGET_VERIFY and bs:
        tree = random_tree(
            bs, topk, depth + 1, num_draft_tokens, seq_lens.to(device), mask_mode, gen
        )
        n = num_draft_tokens
        block = (
            n * (seq_lens + n) if mask_mode is TreeMaskMode.FULL_MASK else torch.full((bs,), n * n)
        )
        mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(block, 0)])
        spec = TargetVerifySpec(n, tree.tree_mask, mask_mode, mask_indptr.to(device))
        positions = tree.positions.cpu()
    elif mode is ForwardMode.DRAFT_DECODE:
        ancestors = torch.tensor(ancestor_slots, dtype=torch.int64).view(bs * topk, depth)
        spec = DraftDecodeSpec(topk, ancestors.to(device))
    elif mode is ForwardMode.DRAFT_EXTEND:
        spec = DraftExtendSpec(num_draft_tokens)

    ext = torch.tensor(extend_lens, dtype=torch.int64) if extend_lens is not None else None
    batch = ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions.to(device),
        seq_lens=seq_lens.to(device),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64).to(device),
        out_cache_loc=torch.tensor(new_slots, dtype=torch.int64).to(device),
        extend_lens=None if ext is None else ext.to(device),
        seq_lens_cpu=None if gpu_only else seq_lens,
        seq_lens_sum=None if gpu_only else sum(prefix_lens),
        extend_lens_cpu=None if gpu_only else ext,
        spec=spec,
    )
    return AttentionCase(pool, table, layer, batch, q, k, v, tree)


def _randn(
    shape: tuple[int, ...] | torch.Size,
    gen: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen).to(dtype=dtype, device=device)
