"""Benchmarks: Llama-3.1-8B's layer dimensions for the fused-kernel benchmarks, and tiny ones
with odd sizes for their smoke runs under the Triton interpreter."""

from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    slots: int  # KV pool size


LLAMA_8B = Shape(4096, 14336, 32, 8, 128, 65_536)
SMOKE = Shape(80, 112, 4, 2, 16, 64)
