"""Adapters: KV memory (slot allocator, req_to_token table, KV pools)."""
