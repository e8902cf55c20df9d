"""`eagletree demo`: one tree decode step on fixed numbers, printed phase by phase.

It runs the real domain functions (beam, tree, greedy verification, move plan, compaction) on a
small hand-made draft so that a reader can follow every tensor; docs/architecture.md walks
through the same numbers.
"""

from __future__ import annotations

import argparse

import torch

from eagletree.domain.compaction import accepted_move_plan, bonus_tokens, compact_to_front
from eagletree.domain.kv_move import move_rows_reference
from eagletree.domain.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from eagletree.domain.verify import verify_tree_greedy

TOPK, STEPS, NUM_DRAFT_TOKENS = 2, 3, 6
PREFIX_LEN = 4  # committed tokens L of the single request
ROOT_TOKEN = 7  # the bonus token of the previous step
WINDOW_FIRST_SLOT = 40  # req_to_token[L : L + N] = slots 40..45

# Draft proposals per step: (probabilities, tokens) of the k children of each beam branch.
DRAFT_STEPS = [
    ([[0.6, 0.3]], [[11, 12]]),  # children of the root
    ([[0.5, 0.2], [0.9, 0.05]], [[21, 22], [23, 24]]),  # children of branches 11 and 12
    ([[0.7, 0.2], [0.6, 0.3]], [[31, 32], [33, 34]]),  # children of the step-1 survivors
]
# The target's argmax after each tree node (node order of the built tree).
TARGET_ARGMAX = [12, 99, 23, 50, 40, 60]


def _show(title: str, value: object) -> None:
    print(f"{title:<28} {value}")


def run_step() -> dict[str, torch.Tensor]:
    """Run the step and print every phase; returns the main tensors (used by the tests)."""
    hidden = torch.zeros(1, 4)  # the draft hidden state does not matter for the tree logic
    scores: torch.Tensor | None = None
    score_list, token_list, parents_list = [], [], []
    for step, (probs, tokens) in enumerate(DRAFT_STEPS):
        beam = select_top_k_tokens(
            step, torch.tensor(probs), torch.tensor(tokens), hidden, scores, TOPK
        )
        hidden, scores = beam.hidden_states, beam.scores
        score_list.append(beam.tree_info[0])
        token_list.append(beam.tree_info[1])
        parents_list.append(beam.tree_info[2])
        _show(f"draft step {step} beam tokens", beam.input_ids.tolist())
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, NUM_DRAFT_TOKENS
    )
    candidate_scores = torch.cat([s.flatten(1) for s in score_list], 1)[0]
    _show("candidate scores", [round(x, 4) for x in candidate_scores.tolist()])
    _show("chosen candidates", top_scores_index[0].tolist())
    seq_lens = torch.tensor([PREFIX_LEN])
    tree = build_tree(
        torch.tensor([ROOT_TOKEN]), parent_list, top_scores_index, draft_tokens, seq_lens,
        TOPK, STEPS, NUM_DRAFT_TOKENS, TreeMaskMode.FULL_MASK, seq_lens_sum=PREFIX_LEN,
    )  # fmt: skip
    _show("tree tokens", tree.draft_tokens.tolist())
    _show("parents", tree.parents[0].tolist())
    _show("positions", tree.positions.tolist())
    _show("first child", tree.retrieve_next_token[0].tolist())
    _show("next sibling", tree.retrieve_next_sibling[0].tolist())
    mask = tree.tree_mask.view(NUM_DRAFT_TOKENS, PREFIX_LEN + NUM_DRAFT_TOKENS).int()
    print("tree mask (rows = nodes, columns = 4 prefix tokens then 6 nodes):")
    for row in mask.tolist():
        print("    " + "".join(str(bit) for bit in row))

    candidates = tree.draft_tokens.view(1, NUM_DRAFT_TOKENS)
    result = verify_tree_greedy(
        candidates, tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling,
        torch.tensor([TARGET_ARGMAX]), STEPS,
    )  # fmt: skip
    _show("accept_index", result.accept_index[0].tolist())
    _show("accept_length", result.accept_length.tolist())
    _show("predict", result.predict.tolist())
    bonus = bonus_tokens(result.predict, result.accept_index, result.accept_length)
    _show("bonus token", bonus.tolist())

    verify_slots = torch.arange(WINDOW_FIRST_SLOT, WINDOW_FIRST_SLOT + NUM_DRAFT_TOKENS)
    tgt, src = accepted_move_plan(
        result.accept_index, result.accept_length, verify_slots, NUM_DRAFT_TOKENS
    )
    _show("move plan tgt", tgt.tolist())
    _show("move plan src", src.tolist())
    kv = torch.arange(64, dtype=torch.float32).unsqueeze(1)  # payload = slot id
    move_rows_reference([kv], tgt, src)
    _show("window KV after the move", kv[verify_slots, 0].long().tolist())
    compacted = compact_to_front(result.predict, result.accept_index, NUM_DRAFT_TOKENS)
    emitted = compacted[: int(result.accept_length[0]) + 1]
    _show("emitted tokens", emitted.tolist())
    _show("new committed length", PREFIX_LEN + int(result.accept_length[0]) + 1)
    return {"emitted": emitted, "window_kv": kv[verify_slots, 0], "tgt": tgt, "src": src}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagletree demo", description=__doc__)
    parser.parse_args(argv)
    print(f"one decode step: k={TOPK}, S={STEPS}, N={NUM_DRAFT_TOKENS}, L={PREFIX_LEN}")
    run_step()
    return 0
