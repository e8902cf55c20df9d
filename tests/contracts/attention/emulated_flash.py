"""A torch stand-in for FlashAttention-2's varlen forward, so that the FlashAttention
backend's gather, cascade and merge run on the CPU too."""

from __future__ import annotations

import torch

from eagletree.adapters.attention.flash_varlen import VarlenKernel


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
