"""Adapter helper: view any tensor as same-size integers so that row copies are bit-exact."""

from __future__ import annotations

import torch

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_raw_words(buf: torch.Tensor) -> torch.Tensor:
    """The same memory as an integer tensor of the same element size (a view, no copy).

    Index kernels are missing for some dtypes (float8 on CPU) and a float copy could in principle
    canonicalise NaN payloads; integer views have neither problem.
    """
    word = _SAME_SIZE_INT.get(buf.element_size())
    if word is None:
        raise TypeError(
            f"cannot move rows of dtype {buf.dtype} (element size {buf.element_size()})"
        )
    return buf if buf.dtype == word else buf.view(word)
