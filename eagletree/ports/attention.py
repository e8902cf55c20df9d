"""Port: attention over a runner's KV pool, for every forward mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from eagletree.domain.attention_layer import AttentionLayer
    from eagletree.domain.batch import ForwardBatch


class AttentionBackend(Protocol):
    """Computes attention for one layer of one forward; owned by one runner with its pools.

    Contract (tests/contracts/attention/, every adapter against the torch reference):
      * ``init_forward_metadata(batch)`` is called once per forward, before the layers; it may
        only fill preallocated buffers (so that the engine can capture CUDA graphs) and, when
        ``batch.seq_lens_sum is None`` (a GPU-only batch), must not synchronise with the host.
      * ``forward(q, k, v, layer, batch, save_kv)``: with ``save_kv`` the new tokens' k and v
        are first written to the pool at ``batch.out_cache_loc``; then every query attends as
        the batch's mode says (``domain.batch``). Returns o: (num_tokens, num_q_heads·v_head_dim)
        in q's dtype. Every key, the new tokens' included, is read from the pool, so with
        ``save_kv=False`` the caller must already have written the new rows (and an fp8 pool's
        new keys are read quantised, like its prefix).
      * Shapes (MHA): q (num_tokens, num_q_heads, head_dim), k (num_tokens, kv_heads, head_dim),
        v (num_tokens, kv_heads, v_head_dim). MLA (absorbed form): q (num_tokens, num_q_heads,
        kv_lora_rank + qk_rope_head_dim), k (num_tokens, 1, kv_lora_rank + qk_rope_head_dim) is
        the new latent + rope row, v is unused (may be None) because values are the latent.
      * An IDLE batch (bs == 0) returns an empty output and needs no tree indices; so does a
        batch of any mode with no requests.
      * Errors: a batch whose shapes contradict its mode (token count, missing spec) raises
        ValueError; forward for a batch that init_forward_metadata did not see raises
        RuntimeError; a layer that does not match the pool's family or widths raises ValueError.
    """

    def init_forward_metadata(self, batch: ForwardBatch) -> None: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv: bool = True,
    ) -> torch.Tensor: ...
