"""Random attention batches for the AttentionBackend contract tests, and a naive per-query oracle.

A case owns a real KV pool and req_to_token table filled with random rows, a ForwardBatch of one
mode, and the q/k/v of its new tokens. Row contents beyond each request's prefix are stale slot
ids on purpose: a backend must read new tokens through ``out_cache_loc`` and ancestors through
``ancestor_slots``, never through req_to_token past ``L_b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagletree.adapters.attention.flash_varlen import VarlenKernel
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
from tests.batch_widths import fixed_width

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


def naive_attention(case: AttentionCase) -> torch.Tensor:
    """Plain SDPA per query and head over an explicit key list → (num_tokens, H·Dv) fp32.

    The key lists come from the mode's meaning, not from the backends' plan: tree ancestors are
    walked through ``DraftTree.parents``; the pool rows are ``case.expected_buffers()``.
    """
    batch, layer = case.batch, case.layer
    buffers = case.expected_buffers()
    if len(buffers) == 1:
        keys_buf = buffers[0].float()
        values_buf = keys_buf[..., : layer.v_head_dim]
    else:
        keys_buf, values_buf = buffers
    table = case.req_to_token.req_to_token.cpu()
    seq_lens = batch.seq_lens.cpu().tolist()
    rows = batch.req_pool_indices.cpu().tolist()
    group = layer.num_q_heads // layer.num_kv_heads
    out = torch.zeros(batch.num_tokens, layer.num_q_heads, layer.v_head_dim)
    token = 0
    for b, prefix in enumerate(seq_lens):
        prefix_slots = table[rows[b], :prefix].tolist()
        tails = _tail_lists(case, b, token)
        for i, tail in enumerate(tails):
            slots = torch.tensor(prefix_slots + tail, dtype=torch.int64)
            keys = keys_buf.cpu()[slots].float()  # (len, Hk, Dk)
            values = values_buf.cpu()[slots].float()
            for h in range(layer.num_q_heads):
                query = case.q[token + i, h].cpu().float().view(1, 1, -1)
                out[token + i, h] = F.scaled_dot_product_attention(
                    query,
                    keys[:, h // group].unsqueeze(0),
                    values[:, h // group].unsqueeze(0),
                    scale=layer.scaling,
                ).view(-1)
        token += len(tails)
    return out.view(batch.num_tokens, layer.num_q_heads * layer.v_head_dim)


def _tail_lists(case: AttentionCase, b: int, first_token: int) -> list[list[int]]:
    """For each query of request b, the slots of the tail keys it sees."""
    batch = case.batch
    slots = batch.out_cache_loc.cpu().tolist()
    mode = batch.mode
    if mode is ForwardMode.EXTEND:
        assert batch.extend_lens is not None
        n = int(batch.extend_lens[b])
        return [slots[first_token : first_token + i + 1] for i in range(n)]
    if mode is ForwardMode.DECODE:
        return [[slots[first_token]]]
    if mode is ForwardMode.DRAFT_EXTEND:
        n = fixed_width(batch)
        return [slots[first_token : first_token + i + 1] for i in range(n)]
    if mode is ForwardMode.TARGET_VERIFY:
        assert case.tree is not None
        parents = case.tree.parents[b].cpu().tolist()
        lists = []
        for i in range(len(parents)):
            chain, node = [], i
            while node >= 0:
                chain.append(slots[first_token + node])
                node = parents[node]
            lists.append(chain[::-1])
        return lists
    assert isinstance(batch.spec, DraftDecodeSpec)
    topk = batch.spec.topk
    ancestors = batch.spec.ancestor_slots.cpu().tolist()
    return [ancestors[b * topk + j] + [slots[first_token + j]] for j in range(topk)]


def emulated_flash_varlen(lse_layout: str) -> VarlenKernel:
    """A torch stand-in for FlashAttention-2's varlen forward (bottom-right causal mask, GQA,
    +inf LSE on rows without keys), returning the LSE ``"padded"`` (bs, H, max_q) or
    ``"packed"`` (H, total_q), the two layouts FlashAttention versions use."""

    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
        scale: float,
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
        assert cu_q.dtype == cu_k.dtype == torch.int32
        total_q, num_heads, _ = q.shape
        group = num_heads // k.shape[1]
        bs = cu_q.numel() - 1
        o = torch.zeros(total_q, num_heads, v.shape[2], dtype=q.dtype)
        padded = torch.full((bs, num_heads, max_q), float("inf"))
        packed = torch.full((num_heads, total_q), float("inf"))
        starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
        for b in range(bs):
            q0, q1, k0, k1 = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
            sq, sk = q1 - q0, k1 - k0
            assert sq <= max_q and sk <= max_k and k1 <= k.shape[0]
            if sq == 0:
                continue
            keys = k[k0:k1].float().repeat_interleave(group, dim=1)
            values = v[k0:k1].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), keys) * scale
            if causal:
                allowed = torch.arange(sk).view(1, -1) <= torch.arange(sq).view(-1, 1) + sk - sq
                scores = scores.masked_fill(~allowed, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)  # (H, sq)
            probs = torch.where(torch.isneginf(lse).unsqueeze(-1), 0.0, scores.softmax(-1))
            o[q0:q1] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
            lse = torch.where(torch.isneginf(lse), float("inf"), lse)
            padded[b, :, :sq] = lse
            packed[:, q0:q1] = lse
        return o, padded if lse_layout == "padded" else packed

    return run
