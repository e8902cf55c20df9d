"""Reference semantics in plain Python for the domain tests: loops over lists, obviously correct.

Nothing here imports eagletree. Scores are float32 in the library, so every product is rounded
to float32 (a product of two float32 values is exact in a Python float, one rounding then gives
IEEE float32 multiplication); that keeps ties and orders bit-identical to the tensors'.
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass, field


def f32(value: float) -> float:
    """Round a Python float to the nearest float32."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


# --- the beam -------------------------------------------------------------------------------


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


def ranked(values: list[float], count: int) -> list[int]:
    """Indices of the ``count`` largest values, best first, ties towards the lower index."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:count]


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


# --- the tree -------------------------------------------------------------------------------


def node_parents_from_beam(selection: list[int], candidate_parent: list[int]) -> list[int]:
    """Parent node of every node, from the beam's own parent flat ids (root = node 0)."""
    node_of = {flat: i + 1 for i, flat in enumerate(selection)}
    return [-1] + [
        0 if candidate_parent[s] < 0 else node_of[candidate_parent[s]] for s in selection
    ]


def node_parents_from_parent_list(
    selection: list[int], parent_list: list[int], k: int
) -> list[int]:
    """Parent node of every node by the spec's rule: pf = s // k, pf == 0 → root, else
    the node whose candidate is parent_list[pf]; topk == 1 → the chain."""
    if k == 1:
        return [-1, *range(len(selection))]
    parents = [-1]
    for s in selection:
        pf = s // k
        parents.append(0 if pf == 0 else 1 + selection.index(parent_list[pf]))
    return parents


def ancestors_or_self(parents: list[int], node: int) -> set[int]:
    chain = {node}
    while parents[node] >= 0:
        node = parents[node]
        chain.add(node)
    return chain


@dataclass
class TreeReference:
    parents: list[list[int]]  # [b][i]
    positions: list[int]  # bs·N
    retrieve_index: list[list[int]]
    next_token: list[list[int]]
    next_sibling: list[list[int]]
    draft_tokens: list[int]  # bs·N
    full_mask: list[bool]  # Σ N·(L_b + N)
    qlen_mask: list[bool]  # bs·N·N


def child_lists(parents: list[int]) -> list[list[int]]:
    """Children of every node in increasing index."""
    return [[j for j in range(len(parents)) if parents[j] == i] for i in range(len(parents))]


def links_from_child_lists(children: list[list[int]]) -> tuple[list[int], list[int]]:
    """First-child and next-sibling links that enumerate ``children`` in the given order."""
    next_token, next_sibling = [-1] * len(children), [-1] * len(children)
    for node, kids in enumerate(children):
        if kids:
            next_token[node] = kids[0]
        for a, b in itertools.pairwise(kids):
            next_sibling[a] = b
    return next_token, next_sibling


def tree_reference(
    node_parents: list[list[int]], node_tokens: list[list[int]], seq_lens: list[int]
) -> TreeReference:
    """Every tensor of ``build_tree`` from per-request parent arrays and tokens (root first)."""
    out = TreeReference([], [], [], [], [], [], [], [])
    for b, parents in enumerate(node_parents):
        n, length = len(parents), seq_lens[b]
        out.parents.append(list(parents))
        out.retrieve_index.append([b * n + i for i in range(n)])
        nxt, sib = links_from_child_lists(child_lists(parents))
        out.next_token.append(nxt)
        out.next_sibling.append(sib)
        out.draft_tokens += node_tokens[b]
        for i in range(n):
            chain = ancestors_or_self(parents, i)
            out.positions.append(length + len(chain) - 1)
            row = [j in chain for j in range(n)]
            out.full_mask += [True] * length + row
            out.qlen_mask += row
    return out


# --- verification ---------------------------------------------------------------------------


@dataclass
class VerifyReference:
    predict: list[int]  # bs·N
    accept_index: list[list[int]]  # [b][S+1]
    accept_length: list[int]


def linked_children(node: int, next_token: list[int], next_sibling: list[int]) -> list[int]:
    kids, cur = [], next_token[node]
    while cur != -1:
        kids.append(cur)
        cur = next_sibling[cur]
    return kids


def verify_greedy_reference(
    candidates: list[list[int]],
    retrieve_index: list[list[int]],
    next_token: list[list[int]],
    next_sibling: list[list[int]],
    target_predict: list[list[int]],
    num_steps: int,
) -> VerifyReference:
    bs = len(candidates)
    n = len(candidates[0]) if bs else 0
    out = VerifyReference([-1] * (bs * n), [], [])
    for b in range(bs):
        path, last = [retrieve_index[b][0]], 0
        for _ in range(num_steps):
            chosen = -1
            for child in linked_children(last, next_token[b], next_sibling[b]):
                if candidates[b][child] == target_predict[b][last]:
                    chosen = child
                    break
            if chosen == -1:
                break
            out.predict[retrieve_index[b][last]] = target_predict[b][last]
            path.append(retrieve_index[b][chosen])
            last = chosen
        out.predict[retrieve_index[b][last]] = target_predict[b][last]
        out.accept_index.append(path + [-1] * (num_steps + 1 - len(path)))
        out.accept_length.append(len(path) - 1)
    return out


def inverse_cdf(weights: list[float], coin: float) -> int:
    """The first token whose float32 cumulative weight exceeds coin·total (float32)."""
    cumulative, total = [], 0.0
    for w in weights:
        total = f32(total + w)
        cumulative.append(total)
    threshold = f32(coin * total)
    for token, c in enumerate(cumulative):
        if c > threshold:
            return token
    return max((t for t, w in enumerate(weights) if w > 0), default=0)


def verify_sampling_reference(
    candidates: list[list[int]],
    retrieve_index: list[list[int]],
    next_token: list[list[int]],
    next_sibling: list[list[int]],
    target_probs: list[list[list[float]]],  # [b][node][token]
    coins: list[list[float]],  # [b][node]
    final_coins: list[float],
    num_steps: int,
) -> VerifyReference:
    bs = len(candidates)
    n = len(candidates[0]) if bs else 0
    out = VerifyReference([-1] * (bs * n), [], [])
    for b in range(bs):
        path, last, rejected = [retrieve_index[b][0]], 0, False
        for _ in range(num_steps):
            row, chosen, acc = target_probs[b][last], -1, 0.0
            for child in linked_children(last, next_token[b], next_sibling[b]):
                acc = f32(acc + row[candidates[b][child]])
                if coins[b][last] < acc:
                    chosen = child
                    break
            if chosen == -1:
                rejected = True
                break
            out.predict[retrieve_index[b][last]] = candidates[b][chosen]
            path.append(retrieve_index[b][chosen])
            last = chosen
        row = list(target_probs[b][last])
        residual = list(row)
        if rejected:
            for child in linked_children(last, next_token[b], next_sibling[b]):
                residual[candidates[b][child]] = 0.0
        if not any(w > 0 for w in residual):
            residual = row
        out.predict[retrieve_index[b][last]] = inverse_cdf(residual, final_coins[b])
        out.accept_index.append(path + [-1] * (num_steps + 1 - len(path)))
        out.accept_length.append(len(path) - 1)
    return out


def probs_reference(
    logits: list[float], temperature: float, top_k: int, top_p: float
) -> list[float]:
    """softmax(logits / T) → keep the top-k, renormalise → keep the smallest most-likely set
    reaching top_p (top_p >= 1 keeps all), renormalise (the SGLang order); T == 0 → one-hot on
    the first argmax."""
    vocab = len(logits)
    if temperature <= 0:
        best = max(range(vocab), key=lambda t: (logits[t], -t))
        return [1.0 if t == best else 0.0 for t in range(vocab)]
    peak = max(logits)
    weights = [math.exp((x - peak) / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    order = ranked(probs, vocab)
    keep = set(order[: top_k if 0 < top_k < vocab else vocab])
    probs = [p / sum(probs[t] for t in keep) if t in keep else 0.0 for t, p in enumerate(probs)]
    kept: set[int] = set()
    mass = 0.0
    for t in order:
        if t in keep and (not kept or mass < top_p or top_p >= 1):
            kept.add(t)
            mass += probs[t]
    return [p / sum(probs[t] for t in kept) if t in kept else 0.0 for t, p in enumerate(probs)]


# --- compaction -----------------------------------------------------------------------------


def move_pairs_reference(
    accept_index: list[list[int]],
    accept_length: list[int],
    verify_slots: list[int],
    num_draft_tokens: int,
) -> list[tuple[int, int]]:
    """(tgt, src) for every accepted node t of every request: window slot t ← the node's slot."""
    return [
        (verify_slots[b * num_draft_tokens + t], verify_slots[accept_index[b][t]])
        for b in range(len(accept_index))
        for t in range(accept_length[b] + 1)
    ]


class FakeKVPool:
    """A KV pool whose payload is the slot id it was written at; moves gather then scatter."""

    def __init__(self, num_slots: int) -> None:
        self.payload = list(range(num_slots))

    def move(self, pairs: list[tuple[int, int]]) -> None:
        values = [self.payload[src] for _, src in pairs]
        for (tgt, _), value in zip(pairs, values, strict=True):
            self.payload[tgt] = value
