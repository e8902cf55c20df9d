"""Reference semantics of a plain step's per-row writes: the specification every kernel matches.

A plain step (no drafts) of a speculative worker decodes one token per request and leaves the
(token, target feature) pair in the row's draft lag for a later catch-up to extend the draft
over; it also stores the row's new committed length and, unless the same step catches the
draft up (which proposes the next pending token itself), the token as the row's pending one.
"""

from __future__ import annotations

import torch


def plain_step_writes(
    rows: torch.Tensor,
    tokens: torch.Tensor,
    features: torch.Tensor,
    seq_lens: torch.Tensor,
    lag_tokens: torch.Tensor,
    lag_features: torch.Tensor,
    lag_count: torch.Tensor,
    committed: torch.Tensor,
    pending: torch.Tensor | None,
) -> None:
    """For each i: append (``tokens[i]``, ``features[i]``) to row ``rows[i]``'s lag, set its
    committed length to ``seq_lens[i] + 1`` and, with ``pending``, its pending token to
    ``tokens[i]``.

    ``rows``, ``tokens``, ``seq_lens``: (bs,) int64; ``features``: (bs, F); ``lag_tokens``:
    (R, W) int64 and ``lag_features`` (R, W, F) the lag's pairs, ``lag_count`` (R,) int64
    how many each row holds; ``committed``, ``pending``: (R,) int64. A full row overwrites
    its last pair. Rows are distinct but for padding rows, which repeat one row no request
    owns: whichever of their writes lands is never read.
    """
    width = lag_tokens.shape[1]
    column = lag_count[rows].clamp(max=width - 1)  # (bs,) int64
    lag_tokens[rows, column] = tokens
    lag_features[rows, column] = features.to(lag_features.dtype)
    lag_count[rows] = column + 1
    committed[rows] = seq_lens + 1
    if pending is not None:
        pending[rows] = tokens
