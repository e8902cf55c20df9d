"""The multi-layer MTP worker's draft-extend batches: the fixed-width one and the ragged one.

After a verify, MTP layer 0 re-extends ``f_b = min(S − 1, L_b)`` rows before each request's
committed length L_b and its N verify rows. While every request has ``L_b >= S − 1`` every
request has the same ``S − 1 + N`` rows and the worker runs a fixed-width DRAFT_EXTEND
(``fixed_extend_batch``: device work only, which a CUDA graph can replay); a step with a shorter
request builds an EXTEND sized on the host (``ragged_extend_batch``).

Every row's input is the token after its position and the target's hidden state at it; each
builder returns (batch, target hidden states (num_tokens, H), bonus rows (bs,)), the bonus row
of request b being its row at its last committed position after the verify.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.domain.batch import DraftExtendSpec, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from eagletree.app.workers.decode_window import DecodeWindow
    from eagletree.app.workers.draft_state import DraftInput
    from eagletree.app.workers.verifier import Verification
    from eagletree.domain.request import Request


def token_at(request: Request, position: int) -> int:
    """The request's token at ``position`` (prompt, then output)."""
    prompt_len = len(request.prompt_ids)
    if position < prompt_len:
        return request.prompt_ids[position]
    return request.output_ids[position - prompt_len]


def front_tokens(request: Request, front: int) -> list[int]:
    """The tokens after each of the request's last ``front`` committed positions (host)."""
    base = request.committed_len - front
    return [token_at(request, base + r + 1) for r in range(front)]


def fixed_extend_batch(
    window: DecodeWindow,
    front_tokens: torch.Tensor,
    state: DraftInput,
    predict: torch.Tensor,
    verification: Verification,
    req_to_token: torch.Tensor,
    *,
    num_steps: int,
    hidden_size: int,
) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor]:
    """Layer 0's DRAFT_EXTEND over ``S − 1 + N`` rows per request from ``L − S + 1``.

    Request b's rows: the S − 1 kept positions (``front_tokens`` (bs, S − 1) int64, the token
    after each; hidden = the kept target states), then its N verify nodes (``predict``
    (bs, N) int64; hidden = the verify's); past a path the rows are unused.
    """
    keep, n = num_steps - 1, predict.shape[1]
    width = keep + n
    bs = window.batch_size
    tokens = torch.cat([front_tokens, predict.clamp(min=0)], dim=1).reshape(bs * width)
    kept = state.hidden_states.view(bs, keep, hidden_size)
    verify_hidden = verification.hidden_states.view(bs, n, hidden_size).to(kept.dtype)
    hidden = torch.cat([kept, verify_hidden], dim=1).reshape(bs * width, hidden_size)
    # padding rows have no committed tokens: clamp keeps their positions at 0..width − 1
    start = (window.seq_lens - keep).clamp(min=0)  # (bs,)
    positions = start.unsqueeze(1) + torch.arange(width, device=start.device)
    rows = window.req_pool_indices
    start_cpu = None if window.seq_lens_cpu is None else window.seq_lens_cpu - keep
    batch = ForwardBatch(
        mode=ForwardMode.DRAFT_EXTEND,
        input_ids=tokens,
        positions=positions.reshape(bs * width),
        seq_lens=start,
        req_pool_indices=rows,
        out_cache_loc=req_to_token[rows.unsqueeze(1), positions].reshape(-1).to(torch.int64),
        seq_lens_cpu=start_cpu,
        seq_lens_sum=None if start_cpu is None else int(start_cpu.sum()),
        spec=DraftExtendSpec(num_tokens_per_request=width),
    )
    block_start = torch.arange(bs, dtype=torch.int64, device=start.device) * width
    last_rows = block_start + keep + verification.result.accept_length.to(torch.int64)
    return batch, hidden, last_rows


def ragged_extend_batch(
    requests: list[Request],
    window: DecodeWindow,
    state: DraftInput,
    verification: Verification,
    req_to_token: torch.Tensor,
    *,
    num_steps: int,
    num_draft_tokens: int,
    hidden_size: int,
) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor]:
    """Layer 0's EXTEND over ``f_b + N`` rows of request b from ``L_b − f_b``.

    Request b's rows: ``f_b`` rows before L_b (their tokens are on the host, their target
    hidden states kept from earlier steps), then its N verify rows (tokens = predict, the token
    after each node; hidden = the verify's).
    """
    n, keep = num_draft_tokens, num_steps - 1
    device = window.seq_lens.device
    bs = window.batch_size
    fronts = [min(keep, r.committed_len) for r in requests]  # host lengths, no device read
    front_cpu = torch.tensor(fronts, dtype=torch.int64)
    lens_cpu = front_cpu + n
    starts_cpu = torch.cumsum(lens_cpu, 0) - lens_cpu
    source, front_table = _window_sources(requests, fronts, keep, n)
    source_dev = to_device(source, device)
    predict = verification.result.predict.to(torch.int64).clamp(min=0)  # past a path: unused
    tokens = torch.cat([to_device(front_table, device), predict]).index_select(0, source_dev)
    kept = state.hidden_states.reshape(bs * keep, hidden_size)
    verify_hidden = verification.hidden_states.to(kept.dtype)
    hidden = torch.cat([kept, verify_hidden]).index_select(0, source_dev)
    assert window.seq_lens_cpu is not None, "the ragged extend is sized on the host"
    seq_lens_cpu = window.seq_lens_cpu - front_cpu
    total = int(lens_cpu.sum())
    positions_cpu = torch.repeat_interleave(seq_lens_cpu, lens_cpu) + (
        torch.arange(total) - torch.repeat_interleave(starts_cpu, lens_cpu)
    )
    positions = to_device(positions_cpu, device)
    token_rows = torch.repeat_interleave(
        window.req_pool_indices, to_device(lens_cpu, device), output_size=total
    )  # the output size given: no sync
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND,
        input_ids=tokens,
        positions=positions,
        seq_lens=to_device(seq_lens_cpu, device),
        req_pool_indices=window.req_pool_indices,
        out_cache_loc=req_to_token[token_rows, positions].to(torch.int64),
        extend_lens=to_device(lens_cpu, device),
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=int(seq_lens_cpu.sum()),
        extend_lens_cpu=lens_cpu,
    )
    accept_length = verification.result.accept_length.to(torch.int64)
    last_rows = to_device(starts_cpu + front_cpu, device) + accept_length
    return batch, hidden, last_rows


def _window_sources(
    requests: list[Request], front: list[int], keep: int, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each extend row's token and target hidden state come from (host).

    Sources are indexed in ``cat([front table (bs·(S−1)), verify rows (bs·N)])``: front row
    r of request b is entry ``b·(S−1) + (S−1−f_b) + r`` (the kept hidden states are the
    last S − 1 positions, oldest first); verify row j is ``bs·(S−1) + b·N + j``. Returns
    (source (Σ rows,) int64, front tokens (bs·(S−1),) int64: the token after each kept
    position, which the host knows).
    """
    bs = len(requests)
    source: list[int] = []
    table = [0] * (bs * keep)
    for b, (request, f) in enumerate(zip(requests, front, strict=True)):
        for r, token in enumerate(front_tokens(request, f)):
            entry = b * keep + keep - f + r
            table[entry] = token
            source.append(entry)
        source.extend(bs * keep + b * n + j for j in range(n))
    return torch.tensor(source, dtype=torch.int64), torch.tensor(table, dtype=torch.int64)
