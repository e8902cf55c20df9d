"""The EAGLE beam in plain Python: every step's survivors and tree info, every
candidate by flat id, and the N − 1 candidates a tree keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from .scores import f32, ranked


@dataclass
class BeamStepReference:
    """What one beam step must return, per the spec."""

    input_ids: list[int]  # bs·k tokens of the survivors
    hidden_rows: list[int]  # bs·k: the row of the step's hidden_states input each survivor takes
    scores: list[list[float]]  # [b][r] survivor scores, best first
    candidate_scores: list[list[float]]  # [b][local candidate] (k at step 0, k² after)
    candidate_tokens: list[list[int]]  # [b][local candidate]
    parent_ids: list[list[int]]  # [b][·] the tree info "parents" entry of this step


@dataclass
class BeamReference:
    """All candidates of all steps, by flat id, and the per-step results."""

    steps: list[BeamStepReference] = field(default_factory=list)
    scores: list[list[float]] = field(default_factory=list)  # [b][flat id]
    tokens: list[list[int]] = field(default_factory=list)  # [b][flat id]
    parent: list[list[int]] = field(default_factory=list)  # [b][flat id] parent flat id, −1 root


def beam_reference(
    step_probs: list[list[list[float]]], step_tokens: list[list[list[int]]], bs: int, k: int
) -> BeamReference:
    """Run the EAGLE beam: step 0 rows are per request, step i >= 1 rows are per branch b·k+p."""
    out = BeamReference(
        scores=[[] for _ in range(bs)],
        tokens=[[] for _ in range(bs)],
        parent=[[] for _ in range(bs)],
    )
    beam_ids = [list(range(k)) for _ in range(bs)]
    beam_scores = [list(step_probs[0][b]) for b in range(bs)]
    out.steps.append(
        BeamStepReference(
            input_ids=[step_tokens[0][b][c] for b in range(bs) for c in range(k)],
            hidden_rows=[b for b in range(bs) for _ in range(k)],
            scores=[list(row) for row in beam_scores],
            candidate_scores=[list(step_probs[0][b]) for b in range(bs)],
            candidate_tokens=[list(step_tokens[0][b]) for b in range(bs)],
            parent_ids=[[-1, *range(k)] for _ in range(bs)],
        )
    )
    for b in range(bs):
        out.scores[b] += step_probs[0][b]
        out.tokens[b] += step_tokens[0][b]
        out.parent[b] += [-1] * k
    for step in range(1, len(step_probs)):
        base = k + k * k * (step - 1)
        result = BeamStepReference([], [], [], [], [], [])
        for b in range(bs):
            local_scores, local_tokens = [], []
            for p in range(k):
                for c in range(k):
                    local_scores.append(f32(beam_scores[b][p] * step_probs[step][b * k + p][c]))
                    local_tokens.append(step_tokens[step][b * k + p][c])
                    out.parent[b].append(beam_ids[b][p])
            out.scores[b] += local_scores
            out.tokens[b] += local_tokens
            survivors = ranked(local_scores, k)
            result.input_ids += [local_tokens[j] for j in survivors]
            result.hidden_rows += [b * k + j // k for j in survivors]
            result.scores.append([local_scores[j] for j in survivors])
            result.candidate_scores.append(local_scores)
            result.candidate_tokens.append(local_tokens)
            result.parent_ids.append([base + j for j in survivors])
            beam_ids[b] = [base + j for j in survivors]
            beam_scores[b] = [local_scores[j] for j in survivors]
        out.steps.append(result)
    return out


def select_candidates(scores: list[float], num_draft_tokens: int) -> list[int]:
    """The N−1 best flat ids (ties towards the lower id), sorted by flat id."""
    return sorted(ranked(scores, num_draft_tokens - 1))
