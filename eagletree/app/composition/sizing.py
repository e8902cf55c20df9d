"""Composition: the sizes the container derives from the resolved settings and the target.

They are computed here and passed to the adapters, never written back into the settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eagletree.domain.draft_shape import reserved_slots

if TYPE_CHECKING:
    from eagletree.config.eagle_hook import ResolvedSpeculative
    from eagletree.domain.draft_shape import DraftShape

# Slack past the v2 window, as upstream's "+ 4": the bonus token and an off-by-one at the limit.
ROW_HEADROOM = 4


def tokens_allocated_per_step(resolved: ResolvedSpeculative, page_size: int) -> int:
    """KV slots one decode step claims per request (upstream's ``alloc_len_per_decode``).

    A tree takes max(S·k, N) slots (the draft writes k per step, verify N); without
    speculation one. A paged tree (v1 fallback) pads each branch's S slots to whole pages.
    """
    if not resolved.enabled:
        return 1
    steps, topk, tokens = resolved.num_steps, resolved.topk, resolved.num_draft_tokens
    if page_size > 1 and topk > 1:
        pages_per_branch = math.ceil((page_size - 1 + steps) / page_size)
        return max(pages_per_branch * page_size * topk, tokens)
    return max(steps * topk, tokens)


def req_to_token_row_width(
    max_context_len: int,
    resolved: ResolvedSpeculative,
    page_size: int,
    shapes: Sequence[DraftShape],
) -> int:
    """Columns of req_to_token: the context, two steps' windows (the current one and the next
    one the scheduler reserves ahead of the committed length) of the widest of the ``shapes``
    the worker may run (an adaptive policy's candidates reserve their widest window) and a
    little headroom."""
    allocated = 2 * tokens_allocated_per_step(resolved, page_size)
    return max_context_len + max(allocated, reserved_slots(shapes)) + ROW_HEADROOM


def req_to_token_rows(max_running_requests: int) -> int:
    """One row more than requests run at once: the padding row of CUDA-graph batches."""
    return max_running_requests + 1


def max_context_len(asked: int | None, max_position_embeddings: int) -> int:
    """``model.max_context_len``, or the target's position limit when it is unset."""
    return asked if asked is not None else max_position_embeddings
