"""Adapters: attention backends (torch reference, Triton, FlashAttention)."""
