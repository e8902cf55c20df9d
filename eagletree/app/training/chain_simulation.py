"""App: a chain of S draft steps simulated offline, as the engine would commit it.

Under greedy decoding a chain's accepted tokens are the target's own continuation, so the
drafts the head makes at every verify step are those of its teacher-forced unroll over the
prompt and the target's greedy continuation, up to the first mismatch: at the step whose last
committed token sits at position p, the head's step-s draft is its unrolled top-1 at row
p − 1 + s (row q reads the token at q + 1). ``prompt_lookup.simulate`` then replays the verify
steps: accept the longest prefix equal to the continuation, emit it and the target's next
token, jump. What the engine measures with the same head on the same prompts should match
this up to the numerics of its KV-cached, batched forward (fp32 on the CPU: a near tie may
break the other way) — the "engine loses nothing against its own head" check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.draft_loading import eagle3_aux_layer_ids
from eagletree.app.training.acceptance_row import AcceptanceRow, TreeShape
from eagletree.app.training.checkpoint import head_shape
from eagletree.app.training.depth_profile import teacher_forced
from eagletree.app.training.heads import DraftHead, Eagle3Head, EagleHead
from eagletree.app.training.prompt_lookup import simulate
from eagletree.app.training.target_features import HFTarget
from eagletree.domain.acceptance_stats import AcceptanceStats


@dataclass(frozen=True, slots=True)
class UnrolledDrafter:
    """Proposes, for a context of ``len(context)`` tokens, the precomputed unrolled drafts
    ``drafts[s][q]`` (target ids) of the path rooted at row ``len(context) − 2``."""

    drafts: list[list[int]]

    def propose(self, context: Sequence[int]) -> list[int]:
        root = len(context) - 2
        proposal = []
        for step, row in enumerate(self.drafts):
            if root + step >= len(row):
                break
            proposal.append(row[root + step])
        return proposal


@torch.no_grad()
def unrolled_drafts(
    head: DraftHead,
    target: HFTarget,
    draft_to_target: torch.Tensor | None,
    sequence: Sequence[int],
    num_steps: int,
) -> list[list[int]]:
    """``[s][q]``: the head's top-1 target id at unrolled step s, row q, over ``sequence``."""
    tokens = torch.tensor([list(sequence)], dtype=torch.int64)
    logits, _ = teacher_forced(head, target, tokens, num_steps, draft_to_target is not None)
    drafts = []
    for step_logits in logits:
        top = step_logits[0].argmax(-1)
        if draft_to_target is not None:
            top = draft_to_target.to(top.device)[top]
        drafts.append(top.tolist())  # SYNC: evaluation
    return drafts


def simulated_chain(
    head: DraftHead,
    target: HFTarget,
    draft_to_target: torch.Tensor | None,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    num_steps: int,
) -> AcceptanceRow:
    """The chain S = ``num_steps`` row of ``head`` on these prompts, ``continuations`` being the
    target's greedy outputs (the engine's plain decoding gives them)."""
    started = time.perf_counter()
    per_request = []
    for prompt, continuation in zip(prompts, continuations, strict=True):
        sequence = [*prompt, *continuation]
        drafts = unrolled_drafts(head, target, draft_to_target, sequence, num_steps)
        emitted = simulate(UnrolledDrafter(drafts), prompt, continuation)
        per_request.append(AcceptanceStats.from_counts(emitted))
    return AcceptanceRow.of(
        TreeShape.chain(num_steps),
        per_request,
        continuations,
        matches_plain=True,  # it emits the target's own tokens only
        seconds=time.perf_counter() - started,
    )


def load_trained_head(
    head_dir: Path, target_dir: Path, algorithm: str, device: torch.device
) -> tuple[DraftHead, HFTarget, torch.Tensor | None]:
    """A head ``train-draft`` wrote, as its training module, with the target it reads (fp32 on
    the CPU, bf16 on CUDA, as in training) and EAGLE-3's draft id → target id map."""
    from safetensors.torch import load_file

    reader = ConfigReader.from_dir(target_dir)
    shape = head_shape(reader)
    tensors = load_file(str(head_dir / "model.safetensors"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    head: EagleHead | Eagle3Head
    if algorithm == "eagle3":
        aux = eagle3_aux_layer_ids(head_dir, reader.get_int("num_hidden_layers"))
        target = HFTarget(target_dir, dtype, device, aux)
        d2t = tensors.pop("d2t")
        tensors.pop("t2d", None)
        head = Eagle3Head(shape, len(aux), d2t.numel())
        draft_to_target: torch.Tensor | None = torch.arange(d2t.numel()) + d2t
    else:
        target = HFTarget(target_dir, dtype, device)
        num_layers = len({k.split(".")[1] for k in tensors if k.startswith("layers.")})
        head = EagleHead(shape, num_layers, target.lm_head)
        draft_to_target = None
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return head.to(device).eval(), target, draft_to_target
