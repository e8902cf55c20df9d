"""Pure logic on torch tensors: no I/O, no kernels, no settings, no dependency injection."""
