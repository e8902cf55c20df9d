"""train-draft's checkpoints: the EAGLE-3 head carries a draft vocabulary and the target layers
it fuses, which load back, and --resume continues exactly where a checkpoint stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import pytest
import torch
from safetensors.torch import load_file

from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.loading import load_models
from eagletree.app.cli.main import main
from eagletree.app.training.draft_trainer import DraftTrainer
from eagletree.app.training.heads import Eagle3Head
from eagletree.app.training.options import TrainOptions, aux_layer_ids
from eagletree.domain.errors import ConfigurationError
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
def test_a_head_fusing_the_last_layers_output_says_so_and_the_engine_captures_it(
    pair: Pair, tmp_path: Path
) -> None:
    out = tmp_path / "last"
    report = train(pair, "eagle3", out, "--max-steps", "2", "--eval-prompts", "0",
                   "--aux-layers", "last")  # fmt: skip
    assert report["options"]["aux_layers"] == "last"
    num_layers = SPEC.num_layers
    # written as layer outputs (SGLang's convention): the last id is the last layer's output
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"][-1] == num_layers - 1
    loaded = load_models(pair.target, out, "eagle3", torch.float32, "cpu")
    captured = loaded.target.aux_layer_ids
    assert captured == aux_layer_ids("last", num_layers) == (2, num_layers // 2, num_layers)
    assert aux_layer_ids("standard", num_layers) == (2, num_layers // 2, 0)


@pytest.mark.parametrize("spec", ["top", "1,x", "1,9"])
def test_aux_layers_that_name_no_layers_are_refused_with_what_to_give(spec: str) -> None:
    with pytest.raises(ConfigurationError, match=r"--aux-layers .*standard or last.*0\.\.3"):
        aux_layer_ids(spec, 3)


@pytest.mark.hf
@pytest.mark.parametrize("start", ["ones", "target"])
def test_eagle3s_norm_starts_as_asked_beside_the_targets_lm_head_rows(
    pair: Pair, tmp_path: Path, start: Literal["ones", "target"]
) -> None:
    options = TrainOptions(pair.target, "eagle3", (pair.corpus,), tmp_path / start, seq_len=32,
                           draft_vocab_size=DRAFT_VOCAB, eagle3_norm=start)  # fmt: skip
    trainer = DraftTrainer(options)
    head, target = trainer.head, trainer.target
    assert isinstance(head, Eagle3Head) and trainer.vocab is not None
    final_norm = target.model.model.norm.weight
    assert not torch.allclose(final_norm, torch.ones_like(final_norm))  # a trained norm
    expected = final_norm.float() if start == "target" else torch.ones_like(final_norm)
    torch.testing.assert_close(head.norm.weight.detach(), expected)
    rows = trainer.vocab.target_ids
    torch.testing.assert_close(head.lm_head.weight.detach(), target.lm_head.weight[rows].float())


@pytest.mark.hf
@pytest.mark.parametrize("lm_head", ["trained", "frozen"])
def test_eagle3s_lm_head_trains_or_stays_the_targets_rows(
    pair: Pair, tmp_path: Path, lm_head: Literal["trained", "frozen"]
) -> None:
    options = TrainOptions(pair.target, "eagle3", (pair.corpus,), tmp_path / lm_head,
                           max_steps=3, seq_len=32, eval_prompts=0, draft_vocab_size=DRAFT_VOCAB,
                           eagle3_lm_head=lm_head)  # fmt: skip
    trainer = DraftTrainer(options)
    head = trainer.head
    assert isinstance(head, Eagle3Head)
    start = head.lm_head.weight.detach().clone()
    trainer.train()
    after = head.lm_head.weight.detach()
    assert torch.equal(after, start) == (lm_head == "frozen")
    assert not torch.equal(head.norm.weight.detach(), torch.ones_like(after[0]))  # it trained


@pytest.mark.hf
def test_aux_layers_for_an_eagle1_head_are_refused(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train-draft", "--target", str(pair.target), "--algorithm", "eagle", "--data",
            str(pair.corpus), "--out", str(tmp_path / "eagle"), "--max-steps", "1",
            "--aux-layers", "last"]  # fmt: skip
    assert main(args) == 1
    assert "--aux-layers chooses EAGLE-3's fused features: drop it for eagle" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "eagle" / "model.safetensors").exists()


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
