"""Scores as the library computes them: products rounded to float32, and ranking with
ties towards the lower index."""

from __future__ import annotations

import struct


def f32(value: float) -> float:
    """Round a Python float to the nearest float32."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def ranked(values: list[float], count: int) -> list[int]:
    """Indices of the ``count`` largest values, best first, ties towards the lower index."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:count]
