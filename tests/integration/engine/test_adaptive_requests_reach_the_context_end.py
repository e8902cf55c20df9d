"""An adaptive engine serves a request as long as its context allows, as a fixed one does: its
request table's rows hold two of the widest blocks a step it may run writes past a committed
length (a drafting shape's window, or the draft's catch-up over its lag), the reserve its
scheduler keeps there, not the configured shape's window alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.composition.container import build_engine
from eagletree.config.settings import EngineSettings
from eagletree.domain.draft_shape import MAX_LAG, DraftShape
from tests.integration.spec.harness import SIZES, WEIGHT_STD

CONTEXT = 64
WIDE = DraftShape(4, 4, 16)  # a window of 16 slots; the configured chain's is 3


def test_an_adaptive_request_runs_to_the_context_end_whatever_its_widest_candidate(
    tmp_path: Path,
) -> None:
    sizes = dataclasses.replace(SIZES, max_position_embeddings=CONTEXT)
    target, draft = write_random_checkpoint(
        tmp_path, "llama", "eagle", sizes=sizes, dtype=torch.float32, std=WEIGHT_STD
    )
    assert draft is not None
    speculative = {"algorithm": "eagle", "num_steps": 2, "eagle_topk": 1,
                   "num_draft_tokens": 3, "policy": "adaptive",
                   "candidate_shapes": ["plain", "tree:S4,k4,N16"]}  # fmt: skip
    settings = EngineSettings(
        model={"target_path": str(target), "draft_path": str(draft), "device": "cpu",
               "dtype": "float32"},
        speculative=speculative,
        backend={"attention": "torch", "kv_move": "torch"},
        memory={"max_total_tokens": 512, "max_running_requests": 2},
    )  # fmt: skip
    engine = build_engine(settings)
    engine.eos_token_ids = frozenset()  # random weights: an EOS would end it at a random step
    scheduler = engine.scheduler
    # two of the widest blocks a step writes past a committed length: the catch-up's, as wide as
    # the draft's lag, is wider than the tree's window
    assert scheduler.reserve_per_step == 2 * MAX_LAG > 2 * WIDE.window_len
    assert scheduler.capacity_problem(CONTEXT) is None
    prompt = list(range(1, 9))
    (result,) = engine.generate([prompt], max_new_tokens=CONTEXT)
    assert len(prompt) + len(result.output_ids) == CONTEXT  # cut by the context, no error
    assert scheduler.allocator.available_size() == 512  # every slot back
