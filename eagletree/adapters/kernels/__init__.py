"""Adapters: compute kernels."""
