"""Benchmarks: scripts that measure and print tables (never assert times); run each from the
repository root as ``python -m benchmarks.NAME``."""
