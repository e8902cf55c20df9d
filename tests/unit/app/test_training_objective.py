"""The training objective's choices: the labels (hard, soft, mixed), the per-device defaults,
the CLI's validation of --labels."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from torch.nn import functional

from eagletree.app.training import cli
from eagletree.app.training.losses import label_loss, soft_cross_entropy
from eagletree.app.training.objective import LossWeights
from eagletree.app.training.options import TrainOptions, device_defaults


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator)
    target_logits = torch.randn(2, 5, 7, generator=generator)
    rows = torch.rand(2, 5, generator=generator) > 0.3
    return logits, target_logits.softmax(-1), target_logits.argmax(-1), rows


def test_hard_labels_are_cross_entropy_on_the_targets_argmax_over_the_valid_rows() -> None:
    logits, _, argmax, rows = _batch()
    got = label_loss("hard", logits, None, argmax, rows)
    expected = functional.cross_entropy(logits[rows], argmax[rows])
    torch.testing.assert_close(got, expected)


def test_an_out_of_vocabulary_row_outside_the_mask_changes_nothing() -> None:
    logits, _, argmax, rows = _batch()
    rows[0, 0] = False
    marked = argmax.clone()
    marked[0, 0] = -1  # the draft vocabulary lacks this row's token
    torch.testing.assert_close(
        label_loss("hard", logits, None, marked, rows),
        label_loss("hard", logits, None, argmax, rows),
    )


def test_soft_labels_are_the_soft_cross_entropy_and_mixed_is_the_mean_of_both() -> None:
    logits, probs, argmax, rows = _batch()
    soft = label_loss("soft", logits, probs, argmax, rows)
    torch.testing.assert_close(soft, soft_cross_entropy(logits, probs, rows))
    hard = label_loss("hard", logits, probs, argmax, rows)
    torch.testing.assert_close(label_loss("mixed", logits, probs, argmax, rows), (hard + soft) / 2)


def test_the_defaults_are_the_short_budget_recipe_and_the_device_picks_batch_and_window() -> None:
    assert LossWeights() == LossWeights(
        cross_entropy=1.0,
        regression=0.2,
        alignment=0.0,
        step_decay=0.8,
        labels="hard",
        ce_precision="bfloat16",
    )
    base = TrainOptions(Path("t"), "eagle3", (Path("d"),), Path("o"))
    # the learning rate the sweep chose (docs/training.md); the recipe's unroll and warm-up
    assert (base.lr, base.unroll_steps, base.warmup_steps) == (3e-3, 4, 50)
    on_gpu = TrainOptions(Path("t"), "eagle3", (Path("d"),), Path("o"), device="cuda:0").resolved()
    assert (on_gpu.batch, on_gpu.window) == (64, 512) == tuple(device_defaults("cuda"))
    on_cpu = base.resolved()
    assert (on_cpu.batch, on_cpu.window) == (8, 256)
    # a given value wins over the device's
    assert TrainOptions(Path("t"), "eagle", (), Path("o"), batch_size=3).resolved().batch == 3


def test_the_cli_takes_the_labels_and_names_the_flag_when_they_are_wrong(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    required = ["train-draft", "--target", "t", "--algorithm", "eagle", "--data", "d", "--out", "o"]
    args = parser.parse_args([*required, "--labels", "mixed"])
    # the CLI's defaults are the options' (the device fills batch and window in later)
    default = TrainOptions(Path("t"), "eagle", (Path("d"),), Path("o"))
    assert args.labels == "mixed" and args.batch_size is None and args.lr == default.lr
    assert args.ce_precision == default.loss.ce_precision == "bfloat16"
    assert (args.regression_weight, args.alignment_weight) == (0.2, 0.0)
    assert (default.loss.regression, default.loss.alignment) == (0.2, 0.0)
    assert parser.parse_args([*required, "--ce-precision", "float32"]).ce_precision == "float32"
    with pytest.raises(SystemExit):
        parser.parse_args([*required, "--labels", "sof"])
    assert "--labels 'sof': expected one of hard, soft, mixed" in capsys.readouterr().err


def test_a_bfloat16_cross_entropy_matches_the_float32_one_on_random_logits() -> None:
    generator = torch.Generator().manual_seed(1)
    rows_n, vocab = 512, 4096
    source = 3.0 * torch.randn(rows_n, vocab, generator=generator)
    ids = torch.randint(0, vocab, (rows_n,), generator=generator)
    rows = torch.rand(rows_n, generator=generator) > 0.2
    half = source.to(torch.bfloat16).requires_grad_()
    full = half.detach().float().requires_grad_()  # the same values, upcast
    loss_half = label_loss("hard", half, None, ids, rows)
    loss_full = label_loss("hard", full, None, ids, rows)
    assert loss_half.dtype == torch.float32
    torch.testing.assert_close(loss_half, loss_full, rtol=2e-4, atol=0.0)
    torch.autograd.backward(loss_half + loss_full)
    assert half.grad is not None and full.grad is not None
    # softmax − one-hot, over the valid rows: within bfloat16's rounding of each entry
    torch.testing.assert_close(half.grad.float(), full.grad, rtol=1.6e-2, atol=1e-6)


def test_the_objective_hands_the_cross_entropy_the_logits_in_the_precision_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import eagletree.app.training.objective as module
    from eagletree.app.training.head_modules import HeadShape
    from eagletree.app.training.heads import EagleHead
    from eagletree.app.training.target_features import TargetBatch

    shape = HeadShape(16, 32, 2, 1, 8, 1e-6, 10_000.0)
    embed, lm_head = torch.nn.Embedding(24, 16), torch.nn.Linear(16, 24, bias=False)

    class Target:
        device = torch.device("cpu")
        embed_tokens = embed

        def __call__(self, tokens: torch.Tensor) -> TargetBatch:
            hidden = embed(tokens)
            return TargetBatch(lm_head(hidden).float(), hidden, None)

    class BFloat16Head(EagleHead):  # what CUDA's autocast makes of the lm_head's output
        def logits(self, out: torch.Tensor) -> torch.Tensor:
            return super().logits(out).to(torch.bfloat16)

    seen: list[torch.dtype] = []
    real = label_loss

    def recording(labels: str, logits: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        seen.append(logits.dtype)
        return real(labels, logits, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "label_loss", recording)
    tokens = torch.randint(0, 24, (2, 6), generator=torch.Generator().manual_seed(0))
    for precision, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        seen.clear()
        weights = LossWeights(ce_precision=precision)  # type: ignore[arg-type]
        head = BFloat16Head(shape, 1, lm_head)
        result = module.Objective(head, Target(), 2, weights, None)(tokens)  # type: ignore[arg-type]
        assert seen == [dtype, dtype] and torch.isfinite(result.loss)


@pytest.mark.parametrize("labels", ["hard", "soft", "mixed"])
def test_the_targets_logits_are_read_in_their_own_dtype_as_if_upcast(labels: str) -> None:
    # a bfloat16 target hands its logits over as they are (no float32 copy of batch × seq ×
    # vocab): the labels and the loss are those of the same values upcast first
    from eagletree.app.training.head_modules import HeadShape
    from eagletree.app.training.heads import EagleHead
    from eagletree.app.training.objective import Objective
    from eagletree.app.training.target_features import TargetBatch

    torch.manual_seed(0)
    shape = HeadShape(16, 32, 2, 1, 8, 1e-6, 10_000.0)
    embed, lm_head = torch.nn.Embedding(24, 16), torch.nn.Linear(16, 24, bias=False)

    class Target:
        device = torch.device("cpu")
        embed_tokens = embed

        def __init__(self, upcast: bool) -> None:
            self.upcast = upcast

        def __call__(self, tokens: torch.Tensor) -> TargetBatch:
            hidden = embed(tokens)
            logits = lm_head(hidden).to(torch.bfloat16)
            return TargetBatch(logits.float() if self.upcast else logits, hidden, None)

    head = EagleHead(shape, 1, lm_head)
    tokens = torch.randint(0, 24, (2, 6), generator=torch.Generator().manual_seed(1))
    weights = LossWeights(labels=labels)  # type: ignore[arg-type]
    results = [
        Objective(head, Target(upcast), 2, weights, None)(tokens)  # type: ignore[arg-type]
        for upcast in (False, True)
    ]
    assert results[0].accuracy == results[1].accuracy
    assert torch.equal(results[0].loss, results[1].loss) and torch.isfinite(results[0].loss)


def test_eagle3_alignment_adds_the_regression_of_each_step_onto_step_0s_next_input() -> None:
    # alignment w: every unrolled step's output at q is pulled, with weight w · decay^s, toward
    # the fused target states at q + 1 (fc of the aux states, detached) — what step 0 reads there
    from eagletree.app.training.head_modules import HeadShape
    from eagletree.app.training.heads import Eagle3Head, unrolled_forward
    from eagletree.app.training.losses import feature_regression, step_weights
    from eagletree.app.training.losses import valid_rows as rows_of
    from eagletree.app.training.objective import Objective
    from eagletree.app.training.target_features import TargetBatch
    from eagletree.app.training.vocab import vocab_map

    torch.manual_seed(0)
    shape = HeadShape(16, 32, 2, 1, 8, 1e-6, 10_000.0)
    embed, lm_head = torch.nn.Embedding(24, 16), torch.nn.Linear(16, 24, bias=False)
    aux_proj = torch.nn.Linear(16, 48, bias=False)

    class Target:
        device = torch.device("cpu")
        embed_tokens = embed

        def __call__(self, tokens: torch.Tensor) -> TargetBatch:
            hidden = embed(tokens)
            return TargetBatch(lm_head(hidden), hidden, aux_proj(hidden))

    head = Eagle3Head(shape, 3, 24)
    vocab = vocab_map(torch.arange(24), 24)
    tokens = torch.randint(0, 24, (2, 7), generator=torch.Generator().manual_seed(1))
    steps, weight = 3, 0.5

    def loss(alignment: float) -> torch.Tensor:
        weights = LossWeights(alignment=alignment)
        objective = Objective(head, Target(), steps, weights, vocab)  # type: ignore[arg-type]
        return objective(tokens).loss

    with torch.no_grad():
        out = Target()(tokens)
        assert out.aux is not None
        outputs = unrolled_forward(head, embed(tokens[:, 1:]), out.aux[:, :-1], steps)
        aligned_to = head.fused_input(out.aux[:, 1:])
        decays = step_weights(steps, 0.8)
        rows = [rows_of(6, step, tokens.device).expand(2, 6) for step in range(steps)]
        expected = sum(
            decays[s] * feature_regression(outputs[s], aligned_to, rows[s]) for s in range(steps)
        )
        got = loss(weight) - loss(0.0)
    assert float(expected) > 0
    torch.testing.assert_close(got, weight * expected)


@pytest.mark.parametrize(
    ("algorithm", "option", "message"),
    [
        ("eagle", ["--alignment-weight", "0.5"], "--alignment-weight is EAGLE-3's alignment loss"),
        ("eagle3", ["--regression-weight", "1"], "--regression-weight is EAGLE-1's feature"),
    ],
)
def test_a_loss_weight_the_algorithm_does_not_read_is_refused(
    algorithm: str,
    option: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # refused before the target is read: the paths need not exist
    args = ["--target", str(tmp_path / "target"), "--algorithm", algorithm, "--data",
            str(tmp_path), "--out", str(tmp_path / "out"), *option]  # fmt: skip
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert message in err and f": drop it for {algorithm}" in err
