"""The draft's top-k with probabilities: the torch reference against a brute force, and the
two-launch Triton kernel against the reference (token ids exact, probabilities to rounding),
with and without a draft's column → target id map."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.sampling import top_k_probs
from tests.conftest import requires_triton


def logits_with_hazards(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random logits with an exact tie for the top spot in row 1 and a −inf half in row 0
    (an EAGLE-3 draft vocabulary leaves the rest of the target vocabulary at −inf)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    logits[0, : vocab // 2] = float("-inf")
    if rows > 1:
        top = float(logits[1].max()) + 1
        logits[1, vocab - 1] = logits[1, 3] = top  # the lower id must come first
    return logits


def scattered_ids(vocab: int, seed: int) -> torch.Tensor:
    """A draft's token map: ``vocab`` distinct ids of a 4× larger vocabulary in random order,
    so that a column is never its own id and a missing or shifted gather shows."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(4 * vocab, generator=generator)[:vocab]


def brute_force(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    probs = torch.softmax(logits.double(), dim=-1)
    probs_out, tokens_out = [], []
    for row in probs.tolist():
        ranked = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        tokens_out.append(ranked)
        probs_out.append([row[i] for i in ranked])
    return probs_out, tokens_out


@pytest.mark.parametrize(("rows", "vocab", "k"), [(3, 96, 4), (2, 13, 1), (4, 80, 13)])
def test_the_reference_takes_the_most_likely_tokens_with_ties_to_the_lower_id(
    rows: int, vocab: int, k: int
) -> None:
    logits = logits_with_hazards(rows, vocab, seed=k)
    probs, tokens = top_k_probs(logits, k)
    expected_probs, expected_tokens = brute_force(logits, k)
    assert tokens.dtype == torch.int64 and probs.dtype == torch.float32
    assert tokens.tolist() == expected_tokens
    expected = torch.tensor(expected_probs, dtype=torch.float64)
    torch.testing.assert_close(probs.double(), expected, rtol=1e-6, atol=1e-12)
    assert tokens[1, 0] == 3  # the tie for the top: the lower id first
    if k > 1:
        assert tokens[1, 1] == vocab - 1


@pytest.mark.parametrize(
    ("rows", "vocab", "k"), [(3, 96, 4), (5, 9000, 8), (2, 130, 1), (4, 4097, 16), (0, 50, 2)]
)
def test_the_triton_kernel_equals_the_reference(
    device: torch.device, rows: int, vocab: int, k: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draft_topk import top_k_probs as triton_top_k

    logits = logits_with_hazards(max(rows, 2), vocab, seed=vocab)[:rows]
    for dtype in (torch.float32, torch.bfloat16):  # the draft's lm_head may return either
        probs, tokens = triton_top_k(logits.to(device, dtype), k)
        ref_probs, ref_tokens = top_k_probs(logits.to(dtype), k)
        assert torch.equal(tokens.cpu(), ref_tokens)
        torch.testing.assert_close(probs.cpu(), ref_probs, rtol=2e-6, atol=1e-9)
    assert probs.shape == tokens.shape == (rows, k)


@pytest.mark.parametrize("chunk", [16, 512, 1024, 2048])
@pytest.mark.parametrize("num_warps", [1, 4])
def test_every_chunk_size_and_warp_count_equals_the_reference(
    device: torch.device, chunk: int, num_warps: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draft_topk import TopKConfig
    from eagletree.adapters.kernels.triton.draft_topk import top_k_probs as triton_top_k

    # ragged last chunk, ties across chunk borders, a row that is -inf but for one chunk; at most
    # 11 chunks a row (16-entry chunks of 5000 entries are 313 programs a row, 20 s in the Triton
    # interpreter, which pays per program)
    vocab = min(5000, 10 * chunk + 7)
    logits = logits_with_hazards(3, vocab, seed=chunk + num_warps)
    probs, tokens = triton_top_k(logits.to(device), 6, config=TopKConfig(chunk, num_warps))
    ref_probs, ref_tokens = top_k_probs(logits, 6)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(probs.cpu(), ref_probs, rtol=2e-6, atol=1e-9)


def test_the_reference_names_its_columns_by_the_token_map() -> None:
    logits = logits_with_hazards(3, 40, seed=5)
    token_ids = scattered_ids(40, seed=5)
    probs, columns = top_k_probs(logits, 7)
    mapped_probs, tokens = top_k_probs(logits, 7, token_ids)
    assert torch.equal(tokens, token_ids[columns]) and tokens.dtype == torch.int64
    assert torch.equal(mapped_probs, probs)


def logits_with_ties_and_infinities(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Few distinct values (ties within and across chunks everywhere), a −inf column, a row
    with only 2 finite entries (its top-k must then take −inf columns, lowest first) and a row
    with its maximum in the last, ragged column."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (rows, vocab), generator=generator).float()
    logits[:, vocab // 3] = float("-inf")
    logits[0] = float("-inf")
    logits[0, [vocab - 1, vocab // 2]] = 1.0
    logits[1, vocab - 1] = 9.0
    return logits


# (vocab, chunk): one chunk, a last chunk of one entry (fewer than k), exact multiples, a
# ragged last chunk of k − 1 entries
EDGES = [(15, 16), (17, 16), (64, 16), (71, 64), (200, 64)]


@pytest.mark.parametrize(("vocab", "chunk"), EDGES)
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("mapped", [False, True])
def test_the_triton_kernel_equals_the_reference_at_chunk_edges_with_ties_and_a_token_map(
    device: torch.device, vocab: int, chunk: int, k: int, mapped: bool
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draft_topk import TopKConfig
    from eagletree.adapters.kernels.triton.draft_topk import top_k_probs as triton_top_k

    seed = vocab * 10 + k
    token_ids = scattered_ids(vocab, seed) if mapped else None
    for logits in (
        logits_with_ties_and_infinities(4, vocab, seed),
        logits_with_hazards(3, vocab, seed),
    ):
        probs, tokens = triton_top_k(
            logits.to(device),
            k,
            None if token_ids is None else token_ids.to(device),
            config=TopKConfig(chunk, 1),
        )
        ref_probs, ref_tokens = top_k_probs(logits, k, token_ids)
        assert torch.equal(tokens.cpu(), ref_tokens)
        torch.testing.assert_close(probs.cpu(), ref_probs, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize(("rows", "vocab", "k"), [(5, 9000, 8), (4, 4097, 16), (1, 300, 2)])
def test_the_triton_kernel_with_a_token_map_equals_the_reference_on_its_default_tile(
    device: torch.device, rows: int, vocab: int, k: int
) -> None:
    requires_triton(device)
    from eagletree.adapters.kernels.triton.draft_topk import top_k_probs as triton_top_k

    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    token_ids = scattered_ids(vocab, seed=k)
    for dtype in (torch.float32, torch.bfloat16):
        probs, tokens = triton_top_k(logits.to(device, dtype), k, token_ids.to(device))
        ref_probs, ref_tokens = top_k_probs(logits.to(dtype), k, token_ids)
        assert torch.equal(tokens.cpu(), ref_tokens)
        torch.testing.assert_close(probs.cpu(), ref_probs, rtol=2e-6, atol=1e-9)
