"""train-draft's checkpoints: the EAGLE-3 head carries a draft vocabulary that loads
back, and --resume continues exactly where a checkpoint stopped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.loading import load_models
from tests.integration.train_draft.pair import DRAFT_VOCAB, SPEC, Pair, train


@pytest.mark.hf
def test_the_eagle3_head_carries_a_draft_vocabulary_that_round_trips(
    pair: Pair, tmp_path: Path
) -> None:
    out = tmp_path / "eagle3"
    train(pair, "eagle3", out, "--max-steps", "2", "--eval-prompts", "0")
    tensors = load_file(str(out / "model.safetensors"))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    target_ids = torch.arange(DRAFT_VOCAB) + d2t
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert t2d.shape == (SPEC.vocab_size,) and int(t2d.sum()) == DRAFT_VOCAB
    assert torch.equal(torch.nonzero(t2d).flatten(), target_ids)
    # the corpus's bytes are all in the draft vocabulary: it was chosen by frequency
    used = torch.tensor(sorted(set(pair.corpus.read_bytes())))
    assert bool(t2d[used].all())
    loaded = load_models(pair.target, out, "eagle3", torch.float32, "cpu")
    draft = loaded.drafts[0]
    assert isinstance(draft, Eagle3Draft)
    assert torch.equal(draft.draft_to_target.cpu(), target_ids)


@pytest.mark.hf
def test_resume_continues_exactly_where_the_checkpoint_stopped(pair: Pair, tmp_path: Path) -> None:
    options = ["--max-steps", "6", "--checkpoint-every", "3", "--eval-prompts", "0"]
    whole = tmp_path / "whole"
    train(pair, "eagle3", whole, *options)
    resumed = tmp_path / "resumed"
    shutil.copytree(whole / "checkpoints" / "step-000003", resumed / "checkpoints" / "step-000003")
    report = train(pair, "eagle3", resumed, *options, "--resume")
    assert report["steps"] == 6 and len(report["losses"]) == 3
    expected = load_file(str(whole / "model.safetensors"))
    actual = load_file(str(resumed / "model.safetensors"))
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    # the interrupted run would have differed: step 3's weights are not step 6's
    at_three = load_file(str(whole / "checkpoints" / "step-000003" / "model.safetensors"))
    assert not torch.equal(at_three["fc.weight"], expected["fc.weight"])
