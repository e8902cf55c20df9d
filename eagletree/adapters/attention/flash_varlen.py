"""Adapter helper: one varlen FlashAttention-2 forward with its log-sum-exp, from either source.

Sources: the ``flash_attn`` package when importable, else PyTorch's bundled FlashAttention-2
(``torch.ops.aten._flash_attention_forward``). Both take packed ``(total, heads, dim)`` q/k/v with
int32 ``cu_seqlens``, support GQA natively, align the causal mask to the bottom right (query i of
a request with ``s_q`` queries and ``s_k`` keys sees keys ``j <= i + s_k − s_q``), and return the
natural-log LSE; a query that sees no key gets o = 0 and LSE = +inf.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# (q, k, v, cu_q, cu_k, max_q, max_k, scale, causal) -> (o (total_q, H, D), lse as returned)
VarlenKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, float, bool],
    tuple[torch.Tensor, torch.Tensor],
]


def _bundled_varlen(
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
    # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
    #   dropout_p, is_causal, return_debug_mask, *, scale) -> (output, softmax_logsumexp, ...)
    result = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
    )
    return result[0], result[1]


def _package_varlen(module: Any) -> VarlenKernel:
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
        o, lse, _ = module.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            return_attn_probs=True,
        )
        return o, lse

    return run


def select_varlen_kernel(use_flash_attn: bool | None) -> tuple[str, VarlenKernel]:
    """The kernel source and its call: ``flash_attn`` if importable (or required), else PyTorch's.

    ``use_flash_attn``: True requires the package, False forces PyTorch's kernels, None prefers
    the package. The choice is logged once per backend.
    """
    if use_flash_attn is not False:
        try:
            module = importlib.import_module("flash_attn")
        except ImportError:
            if use_flash_attn:
                raise
        else:
            logger.info("FlashAttentionBackend: using the flash_attn package")
            return "flash_attn", _package_varlen(module)
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        raise RuntimeError("this PyTorch build has no bundled FlashAttention kernels")
    logger.info("FlashAttentionBackend: flash_attn not importable, using PyTorch's bundled kernels")
    return "torch", _bundled_varlen


def lse_per_token(lse: torch.Tensor, bs: int, width: int) -> torch.Tensor:
    """The LSE of a fixed-width batch (``width`` queries per request) as (bs·width, H), −inf empty.

    Accepts both layouts FlashAttention-2 versions return: (H, total_q) or (bs, H, max_q).
    """
    if lse.dim() == 2:
        per_token = lse[:, : bs * width].t()
    else:
        per_token = lse[:, :, :width].permute(0, 2, 1).reshape(bs * width, lse.shape[1])
    return torch.where(torch.isposinf(per_token), float("-inf"), per_token.float())
