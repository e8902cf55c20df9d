"""App: what `train-draft` measures once a head is trained — per-depth behaviour teacher-forced
on held-out text (``depth_profile``), acceptance through the engine at T = 0 for every shape
and at T = 1 for the first, and the same chains simulated offline (``chain_simulation``), whose
ratio to the engine's says whether the engine loses anything against its own head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from eagletree.app.training import acceptance
from eagletree.app.training.acceptance_row import AcceptanceRow
from eagletree.app.training.chain_simulation import simulated_chain
from eagletree.app.training.depth_profile import DepthProfile, depth_profile

if TYPE_CHECKING:
    from eagletree.app.training.corpus import Corpus
    from eagletree.app.training.heads import DraftHead
    from eagletree.app.training.options import TrainOptions
    from eagletree.app.training.target_features import HFTarget


class Evaluation(NamedTuple):
    profile: DepthProfile | None
    acceptance: list[AcceptanceRow]  # the engine's: T = 0 per shape, then T = 1 for the first
    simulated: list[AcceptanceRow]  # offline, per chain among the shapes

    def as_dict(self, training_agreement: tuple[float, ...]) -> dict[str, Any]:
        """training.json's fields; without held-out text the agreement is the last training
        batch's (``agreement_source`` says which)."""
        fields: dict[str, Any] = {
            "agreement_by_step": list(training_agreement),
            "agreement_source": "last training batch",
        }
        if self.profile is not None:
            fields.update(self.profile.as_dict(), agreement_source="held-out")
        fields["acceptance"] = [row.as_dict() for row in self.acceptance]
        fields["simulated_chains"] = [row.as_dict() for row in self.simulated]
        fields["engine_vs_simulated"] = engine_vs_simulated(self.acceptance, self.simulated)
        return fields


def engine_vs_simulated(
    engine: list[AcceptanceRow], simulated: list[AcceptanceRow]
) -> dict[str, float]:
    """Chain label → the engine's greedy tokens per step ÷ the simulation's."""
    greedy = {row.shape: row for row in engine if row.temperature == 0.0}
    return {
        row.shape.label: greedy[row.shape].mean_accept_length / row.mean_accept_length
        for row in simulated
        if row.shape in greedy and row.mean_accept_length > 0
    }


def evaluate(
    options: TrainOptions,
    head: DraftHead,
    target: HFTarget,
    draft_to_target: torch.Tensor | None,
    corpus: Corpus,
) -> Evaluation:
    """``options`` resolved; the head in eval mode and already saved to ``options.out``."""
    profile = depth_profile(
        head,
        target,
        draft_to_target,
        corpus.held,
        options.unroll_steps,
        options.window,
        options.batch,
    )
    prompts = corpus.eval_prompts
    if not options.eval_prompts or not options.eval_shapes or not prompts:
        return Evaluation(profile, [], [])
    device = options.device
    reference = acceptance.plain_outputs(options.target, prompts, options.eval_new_tokens, device)

    def measure(shapes: list[Any], temperature: float) -> list[AcceptanceRow]:
        return acceptance.measure_acceptance(
            options.target, options.out, options.algorithm, prompts, shapes,
            options.eval_new_tokens, device, reference, temperature=temperature,
            seed=options.seed,
        )  # fmt: skip

    rows = measure(list(options.eval_shapes), 0.0) + measure([options.eval_shapes[0]], 1.0)
    chains = [shape for shape in options.eval_shapes if shape.topk == 1]
    simulated = [
        simulated_chain(head, target, draft_to_target, prompts, reference, shape.num_steps)
        for shape in chains
    ]
    return Evaluation(profile, rows, simulated)
