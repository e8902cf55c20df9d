"""The whole domain step runs on CUDA without a host synchronisation (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.compaction import accepted_move_plan, bonus_tokens, compact_to_front
from eagletree.domain.kv_move import move_rows_reference
from eagletree.domain.sampling import probs_from_logits
from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.domain.verify import verify_tree_greedy, verify_tree_sampling

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize(("bs", "k", "steps", "n"), [(3, 1, 5, 6), (4, 4, 5, 8), (2, 8, 5, 64)])
def test_draft_verify_and_compaction_never_synchronise_with_the_host(
    bs: int, k: int, steps: int, n: int
) -> None:
    device, vocab, hidden_size = torch.device("cuda"), 50, 16
    gen = torch.Generator(device=device).manual_seed(0)
    seq_lens_host = [7 + 3 * b for b in range(bs)]
    seq_lens = torch.tensor(seq_lens_host, device=device)
    verified = torch.randint(vocab, (bs,), device=device, generator=gen)
    hidden = torch.randn((bs, hidden_size), device=device, generator=gen)
    draws = [
        (
            torch.rand((bs if i == 0 else bs * k, k), device=device, generator=gen),
            torch.randint(vocab, (bs if i == 0 else bs * k, k), device=device, generator=gen),
        )
        for i in range(steps)
    ]
    logits = torch.randn((bs * n, vocab), device=device, generator=gen)
    coins = torch.rand((bs, n), device=device, generator=gen)
    final_coins = torch.rand((bs,), device=device, generator=gen)
    kv = [torch.randn((bs * n + 1, 2, 4), device=device, generator=gen)]
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("error")
    try:
        scores, infos = None, []
        for i, (topk_p, topk_index) in enumerate(draws):
            beam = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, k)
            hidden, scores = beam.hidden_states, beam.scores
            infos.append(beam.tree_info)
        parent_list, top_scores_index, draft_tokens = organize_draft_results(
            [t[0] for t in infos], [t[1] for t in infos], [t[2] for t in infos], n
        )
        args = (verified, parent_list, top_scores_index, draft_tokens, seq_lens, k, steps, n)
        tree = build_tree(*args, TreeMaskMode.FULL_MASK, seq_lens_sum=sum(seq_lens_host))
        build_tree(*args, TreeMaskMode.QLEN_ONLY)
        links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
        candidates = tree.draft_tokens.view(bs, n)
        greedy = verify_tree_greedy(candidates, *links, logits.argmax(1).view(bs, n), steps)
        temperature = torch.full((bs * n,), 0.8, device=device)
        top_k = torch.full((bs * n,), 20, device=device)
        top_p = torch.full((bs * n,), 0.9, device=device)
        probs = probs_from_logits(logits, temperature, top_k, top_p)
        sampled = verify_tree_sampling(candidates, *links, probs, coins, final_coins, steps)
        for result in (greedy, sampled):
            slots = torch.arange(1, bs * n + 1, device=device)
            tgt, src = accepted_move_plan(result.accept_index, result.accept_length, slots, n)
            move_rows_reference(kv, tgt, src)
            compact_to_front(result.predict, result.accept_index, n)
            bonus = bonus_tokens(result.predict, result.accept_index, result.accept_length)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert bonus.shape == (bs,)
    assert bool((bonus >= 0).all())  # SYNC: the test reads its result after the checked region
