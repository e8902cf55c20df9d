"""``WrappedDraftRunner``: a base for DraftRunner test doubles that run a real draft runner and
then rewrite its output; everything but ``forward`` is the wrapped runner's."""

from __future__ import annotations

import torch

from eagletree.adapters.models.runner import DraftModelRunner
from eagletree.ports.attention import AttentionBackend
from eagletree.ports.memory import KVPool, ReqToTokenPool


class WrappedDraftRunner:
    """The pools, attention backend and sizes of ``inner``, unchanged."""

    HOST_STAND_IN = True  # a double reads the batch on the host: exempt from the sync tripwire

    def __init__(self, inner: DraftModelRunner) -> None:
        self._inner = inner

    @property
    def kv_pool(self) -> KVPool:
        return self._inner.kv_pool

    @property
    def req_to_token_pool(self) -> ReqToTokenPool:
        return self._inner.req_to_token_pool

    @property
    def attention_backend(self) -> AttentionBackend:
        return self._inner.attention_backend

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._inner.hidden_size

    @property
    def token_ids(self) -> torch.Tensor | None:
        return self._inner.token_ids
