"""Tree verification in plain Python: greedy, and target-only sampling given its
coins (float32 cumulative sums, inverse CDF), and the sampling filters."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .scores import f32, ranked


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
