"""Composition helpers: builders the container calls for optional adapters and torch values."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import MHAKVCache, MLAKVCache, ReqToTokenPool

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a settings dtype name ("bfloat16", "float16", "float32")."""
    try:
        return _DTYPES[name]
    except KeyError:
        allowed = ", ".join(repr(known) for known in _DTYPES)
        raise ConfigurationError(f"model.dtype = {name!r}: allowed values are {allowed}") from None


def flash_attention_backend(
    kv_pool: MHAKVCache | MLAKVCache, req_to_token_pool: ReqToTokenPool, max_batch_size: int
) -> AttentionBackend:
    """FlashAttentionBackend, imported only when selected: flash-attn is an optional extra."""
    try:
        from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
    except ImportError as error:
        raise ConfigurationError(
            "backend.attention = 'flash' needs the flash extra "
            f"(pip install 'eagletree[flash]'), or choose 'triton' or 'torch': {error}"
        ) from error
    return FlashAttentionBackend(
        kv_pool=kv_pool, req_to_token_pool=req_to_token_pool, max_batch_size=max_batch_size
    )
