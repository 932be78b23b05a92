"""Why a node was retrieved: the path of subgraph edges that joins it to a seed along the expansion.

The policy grows the selected set step by step, each step adding nodes adjacent to the set so far
(paper, Section 4), so every node of the retrieved set has an edge to a node selected at an earlier
step. Following such edges back ends at a seed: that chain, read from the seed, is the node's path. Of
several parent edges, the one whose path the relation-path prior (``seeder.retrieve.prior``) rates
highest for the question is taken, where the artifacts have one: the path of the parent extended by the
edge's relation, walked node by node in the order of the steps. Then the parent selected first (the
shortest way back); then the relation whose text reads most like the question (cosine of their
features); then the subgraph's edge order. So a person who directed and wrote a film is joined to it by
the relation the question asks about, and an answer is explained along the question's path rather than
through a genre it shares with the seed. The edges are the graph's own, as K-HOP-WITH-FILTERING extracted them, so a path
never names a fact the graph does not hold.
"""

from __future__ import annotations

import numpy as np

from seeder.data.subgraphs import SubgraphSet, segment_ids, sorted_lookup
from seeder.retrieve.prior import OFF_PATH_TERM


def _num_relations(relation_scores: np.ndarray | None, prior_terms: tuple[np.ndarray, np.ndarray] | None) -> int:
    """R, from whichever per-relation input is given (0 when neither is: then nothing reads the ids)."""
    if relation_scores is not None:
        return relation_scores.shape[1] // 2
    if prior_terms is not None:
        return prior_terms[1].shape[1] // 2
    return 0


def expansion_paths(
    subgraphs: SubgraphSet,
    ranking: np.ndarray,
    steps: np.ndarray,
    relation_scores: np.ndarray | None = None,
    prior_terms: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, ...]:
    """For every (question, rank) of ``ranking`` [Q, L] (global node ids, -1 padded) with ``steps`` [Q, L]
    (0 for a seed, t + 1 for a node added at expansion step t, -1 outside the retrieved set), the path
    from a seed, as arrays [Q, L, D] over its D = max step hops, seed first, -1 padded:
    (from node, relation, forward, to node). ``forward`` is True where the hop follows the relation
    (from -relation-> to) and False where it goes against it (to -relation-> from). A seed's path is
    empty; so is that of a node outside the retrieved set. ``relation_scores`` [Q, 2R]: how well each
    relation id (r forward, r + R inverse) fits each question, to choose among a node's parent edges.
    ``prior_terms``: the prior's [Q, T] log path terms and its trie's children [T, 2R], which choose
    first."""
    num_q, width = ranking.shape
    depth = int(max(steps.max(initial=0), 0))
    empty = np.full((num_q, width, depth), -1, dtype=np.int64)
    if depth == 0 or len(subgraphs.nodes) == 0:
        return empty, empty.copy(), np.zeros_like(empty, dtype=bool), empty.copy()

    # The step of every subgraph node (flat, local): that of its rank where it is in the retrieved set.
    span = int(max(subgraphs.nodes.max(initial=0), ranking.max(initial=0))) + 1
    node_query = segment_ids(subgraphs.node_ptr)
    keys = node_query * span + subgraphs.nodes
    order = np.argsort(keys, kind="stable")
    ranked = (ranking >= 0) & (steps >= 0)
    found, pos = sorted_lookup(keys[order], np.arange(num_q)[:, None] * span + np.maximum(ranking, 0))
    found &= ranked
    local = np.where(found, order[pos], -1)  # [Q, L] flat subgraph position of each ranked node
    step = np.full(len(subgraphs.nodes), -1, dtype=np.int64)
    step[local[found]] = steps[found]

    # Candidate parent edges: an edge whose one end was selected before the other.
    edge_query = segment_ids(subgraphs.edge_ptr)
    head = subgraphs.node_ptr[edge_query] + subgraphs.edge_src
    tail = subgraphs.node_ptr[edge_query] + subgraphs.edge_dst
    forward = (step[head] >= 0) & (step[tail] > step[head])
    backward = (step[tail] >= 0) & (step[head] > step[tail])
    child = np.concatenate([tail[forward], head[backward]])
    parent = np.concatenate([head[forward], tail[backward]])
    relation = np.concatenate([subgraphs.edge_rel[forward], subgraphs.edge_rel[backward]]).astype(np.int64)
    along = np.concatenate([np.ones(forward.sum(), bool), np.zeros(backward.sum(), bool)])
    edge_index = np.concatenate([np.flatnonzero(forward), np.flatnonzero(backward)])
    question = edge_query[edge_index]
    walked = relation + np.where(along, 0, _num_relations(relation_scores, prior_terms))  # id in the direction walked
    fit = relation_scores[question, walked] if relation_scores is not None and len(child) else np.zeros(len(child), np.float32)

    def per_child(candidates: np.ndarray, *keys: np.ndarray) -> np.ndarray:
        """The best of each child's candidate edges: by ``keys``, most significant last, then edge order."""
        order = np.lexsort((edge_index[candidates], *keys, child[candidates]))
        kids = child[candidates][order]
        return candidates[order[np.r_[True, kids[1:] != kids[:-1]]]] if len(order) else candidates

    if prior_terms is None:
        first = per_child(np.arange(len(child)), -fit, step[parent])
    else:
        # Level by level: a node's trie position is its chosen parent's, extended by the edge's relation.
        terms, trie_children = prior_terms
        trie_of = np.where(step == 0, 0, -1)  # seeds sit at the trie's root
        chosen = []
        for level in range(1, depth + 1):
            candidates = np.flatnonzero(step[child] == level)
            at = trie_of[parent[candidates]]
            after = np.where(at >= 0, trie_children[np.maximum(at, 0), walked[candidates]], -1)
            mass = np.where(after >= 0, terms[question[candidates], np.maximum(after, 0)], OFF_PATH_TERM)
            pick = per_child(candidates, -fit[candidates], step[parent[candidates]], -mass)
            trie_of[child[pick]] = after[np.searchsorted(candidates, pick)]
            chosen.append(pick)
        first = np.concatenate(chosen)
    parent_of = np.full(len(step), -1, dtype=np.int64)
    relation_of = np.full(len(step), -1, dtype=np.int64)
    along_of = np.zeros(len(step), dtype=bool)
    parent_of[child[first]], relation_of[child[first]], along_of[child[first]] = parent[first], relation[first], along[first]

    # Walk back from every ranked node, one hop per step; hops fill from the end (the seed's end first).
    hops_from, hops_rel, hops_along, hops_to = empty.copy(), empty.copy(), np.zeros_like(empty, dtype=bool), empty.copy()
    at = root = np.where(found, local, -1)
    chain = []
    for _ in range(depth):  # steps strictly decrease along a walk: at most ``depth`` hops
        up = np.where(at >= 0, parent_of[np.maximum(at, 0)], -1)
        chain.append((up, np.where(at >= 0, relation_of[np.maximum(at, 0)], -1), along_of[np.maximum(at, 0)] & (at >= 0), at))
        root = np.where(up >= 0, up, root)
        at = up
    length = sum((up >= 0).astype(np.int64) for up, _, _, _ in chain)  # hops back to the walk's end
    reaches_seed = (root >= 0) & (step[np.maximum(root, 0)] == 0)
    for back, (up, rel, fwd, to) in enumerate(chain):
        slot = length - 1 - back  # the walk's hop `back` from the node is the path's hop `slot` from the seed
        keep = (up >= 0) & (slot >= 0) & reaches_seed
        q, r = np.nonzero(keep)
        s = slot[q, r]
        hops_from[q, r, s] = subgraphs.nodes[up[q, r]]
        hops_rel[q, r, s] = rel[q, r]
        hops_along[q, r, s] = fwd[q, r]
        hops_to[q, r, s] = subgraphs.nodes[to[q, r]]
    return hops_from, hops_rel, hops_along, hops_to
