"""The static description of one attention layer, as an attention backend needs it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttentionLayer:
    """What a backend must know about a layer: its pool index, head counts, widths and scale.

    For MLA in the absorbed form ``num_kv_heads == 1``, ``head_dim = kv_lora_rank + rope_dim``
    and ``v_head_dim = kv_lora_rank`` (the values are the first ``kv_lora_rank`` latent columns).
    """

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    scaling: float
    is_mla: bool = False
    logit_cap: float = 0.0

    @property
    def gqa_group(self) -> int:
        return self.num_q_heads // self.num_kv_heads
