"""The draft tree in plain Python: node parents (from the beam, or by the spec's
parent_list rule), child lists and their links, and every tensor of ``build_tree``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


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
