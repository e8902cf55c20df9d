"""Speculative workers (EAGLE v1, v2, multi-layer MTP v2)."""
