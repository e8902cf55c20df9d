"""Adapters: concrete implementations of the ports (memory pools, kernels, attention, models)."""
