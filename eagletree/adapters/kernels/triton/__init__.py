"""Triton kernels, one family per module (`_name_kernel` + `name()` launcher)."""
