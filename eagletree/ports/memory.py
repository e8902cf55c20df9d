"""Port: KV memory — the token slot allocator, the req_to_token table and the KV pools.

Slot ids index the first dimension of every KV buffer. Slot 0 is every pool's reserved dummy row:
the allocator never hands it out, padding writes and padding moves (0 -> 0) land there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from eagletree.domain.kv_geometry import KVGeometry


class TokenSlotAllocator(Protocol):
    """Owns the free KV slots ``1..size`` shared by every pool of one engine (target and draft).

    Contract (tests/contracts/test_allocator.py):
      * ``alloc(n)`` returns n distinct free slots, int64, on the allocator's device, or None when
        fewer than n are free, in which case nothing is taken. ``alloc(0)`` returns an empty tensor.
      * ``free(slots)`` returns slots; freeing a slot that is already free raises ``DoubleFree``
        when the allocator checks (always on CPU, in debug mode on GPU: the check synchronises).
      * ``available_size()`` is answered from host state and never waits for the device.
    """

    @property
    def size(self) -> int: ...

    def alloc(self, n: int) -> torch.Tensor | None: ...

    def free(self, slots: torch.Tensor) -> None: ...

    def available_size(self) -> int: ...


class ReqToTokenPool(Protocol):
    """Maps (request row, token position) to a KV slot.

    ``req_to_token`` is an int32 device tensor of shape (max_requests, max_context_len + headroom).
    ``alloc(n)`` returns n free row indices or None (nothing taken); ``free(rows)`` returns them.
    """

    @property
    def req_to_token(self) -> torch.Tensor: ...

    @property
    def size(self) -> int: ...

    def alloc(self, n: int) -> list[int] | None: ...

    def free(self, rows: list[int]) -> None: ...

    def available_size(self) -> int: ...


class RowMover(Protocol):
    """Moves rows between slots of several slot-indexed buffers (the engine of ``move_kv_cache``).

    Contract (tests/contracts/kv_pool/): ``move(buffers, tgt, src)`` equals
    ``domain.kv_move.move_rows_reference`` bit for bit for any (tgt, src) with distinct targets
    (except (0, 0) padding), including chains where a target is another pair's source; any dtype
    (rows are copied as raw bytes); an empty move does nothing and launches nothing. ``tgt`` and
    ``src`` are 1-D integer tensors on the buffers' device; slots are trusted (pools check them).
    The buffers must not overlap in memory, and each buffer's rows must be contiguous.
    """

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None: ...


class KVPool(Protocol):
    """Slot-indexed KV storage of one model's attention layers.

    ``geometry`` says how many slots, pages and layers, the compute dtype and the device; every
    buffer has ``geometry.num_rows`` rows (row 0 is the dummy). ``move_kv_cache(tgt, src)``
    sets ``buf[tgt[i]] = buf[src[i]]`` for every buffer in ``buffers()``, reading every source
    before writing any target (the semantics of ``domain.kv_move.move_rows_reference``); targets
    are distinct except (0, 0) padding pairs. A zero-layer pool returns at once. With bounds
    checking on (always on CPU, behind a debug flag on GPU) an out-of-range slot raises
    ``IndexError`` naming the value and the valid range.

    ``independent_groups=G`` is the caller's promise that a pair only overlaps pairs of its own
    consecutive group of G (pair i is in group i // G) — true of compaction plans, whose groups
    are the S+1 pairs of one request's window; a mover may then move every group at once.
    Checked on CPU; on GPU only with debug checks, so a false promise there corrupts rows.
    """

    @property
    def geometry(self) -> KVGeometry: ...

    def buffers(self) -> list[torch.Tensor]: ...

    def move_kv_cache(
        self,
        tgt_loc: torch.Tensor,
        src_loc: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None: ...


class MHAKVCache(KVPool, Protocol):
    """KV pool of multi-head / grouped-query attention: per layer a K and a V buffer.

    ``get_key_buffer(layer)``: (num_rows, kv_heads, head_dim) in the storage dtype;
    ``get_value_buffer(layer)``: (num_rows, kv_heads, v_head_dim). With an fp8 storage dtype
    the caller converts gathered rows to ``geometry.dtype``; ``set_kv_buffer`` converts on write.
    Row ``slot`` of these buffers is that slot's storage, so a kernel may write new rows there
    directly (converting as ``set_kv_buffer`` does) instead of calling it.
    """

    @property
    def store_dtype(self) -> torch.dtype: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def v_head_dim(self) -> int: ...

    def get_key_buffer(self, layer: int) -> torch.Tensor: ...

    def get_value_buffer(self, layer: int) -> torch.Tensor: ...

    def set_kv_buffer(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None: ...


class MLAKVCache(KVPool, Protocol):
    """KV pool of multi-head latent attention: per layer one buffer of latent + rope key.

    ``get_kv_buffer(layer)``: (num_rows, 1, kv_lora_rank + qk_rope_head_dim).
    ``set_kv_buffer(layer, loc, kv)`` writes rows of that width (latent first, rope last); as
    for MHA, row ``slot`` is that slot's storage and a kernel may write it directly.
    """

    @property
    def kv_lora_rank(self) -> int: ...

    @property
    def qk_rope_head_dim(self) -> int: ...

    def get_kv_buffer(self, layer: int) -> torch.Tensor: ...

    def set_kv_buffer(self, layer: int, loc: torch.Tensor, kv: torch.Tensor) -> None: ...
