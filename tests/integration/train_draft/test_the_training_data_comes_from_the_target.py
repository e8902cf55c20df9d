"""What a head learns from: self-distillation trains on the target's own greedy
continuations, and the target features are the tensors the engine's target captures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.app.training import acceptance
from eagletree.app.training.corpus import build_corpus
from eagletree.app.training.options import TrainOptions
from eagletree.app.training.target_features import HFTarget
from tests.integration.train_draft.pair import SPEC, Pair


@pytest.mark.hf
def test_self_distillation_trains_on_the_targets_own_greedy_continuations(
    pair: Pair, tmp_path: Path
) -> None:
    options = TrainOptions(
        target=pair.target,
        algorithm="eagle",
        data=(pair.corpus,),
        out=tmp_path / "distilled",
        seq_len=32,
        self_distill_prompts=3,
        self_distill_tokens=12,
        prompt_len=16,
    )
    corpus = build_corpus(options, HFTarget(pair.target, torch.float32, torch.device("cpu")))
    sequences = corpus.train.view(3, 16 + 12)
    prompts = sequences[:, :16].tolist()
    text = pair.corpus.read_bytes()
    assert all(bytes(prompt) in text for prompt in prompts)
    # the engine's plain greedy decoding of the same prompts is what the head learns from
    expected = acceptance.plain_outputs(pair.target, prompts, 12, "cpu")
    assert sequences[:, 16:].tolist() == expected


@pytest.mark.hf
def test_target_features_are_the_tensors_the_engine_target_captures(pair: Pair) -> None:
    """Layer i < L: its input (HF's hidden_states[i], which eagletree's parity test matches);
    i = L: the last layer's output before the final norm; hidden: after the final norm."""
    target = HFTarget(pair.target, torch.float32, torch.device("cpu"), (0, 2, 3))
    tokens = torch.tensor([list(b"the quick fox jumps over the lazy dog.")])
    out = target(tokens)
    reference = target.model(input_ids=tokens, output_hidden_states=True)
    assert out.aux is not None
    aux = out.aux.view(*tokens.shape, 3, SPEC.hidden_size)
    torch.testing.assert_close(aux[..., 0, :], reference.hidden_states[0])
    torch.testing.assert_close(aux[..., 1, :], reference.hidden_states[2])
    torch.testing.assert_close(target.model.model.norm(aux[..., 2, :]), out.hidden)
    torch.testing.assert_close(out.logits, reference.logits.float())
