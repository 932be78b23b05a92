"""Why a node was retrieved: the path of subgraph edges that joins it to a seed through the expansion.

The policy grows the selected set step by step, each step adding nodes adjacent to the set so far
(paper, Section 4), so every retrieved node is joined to a seed by edges between selected nodes. Of
those walks, the one the relation-path prior (``seeder.retrieve.prior``) rates highest for the question
explains the node, where the artifacts have one: a search over (node, prefix of a vocabulary path)
pairs, one hop a level over the edges between retrieved nodes, keeps for each node the walk whose path
ends the most prior mass there, with the question's wording against the walk's relations as a second
voice (``_prior_walks`` gives the rule and the order of the ties). So a 3-hop answer that
the policy happened to pick at its first step, as a neighbour of the seed, is still explained along the
question's three relations when the nodes between are retrieved too, and a person who directed and
wrote a film is joined to it by the relation the question asks about. A walk that goes back along the
edge it just took loses to any other walk as likely. Where no walk follows a path of the
prior (or there is no prior), the node's parent is the node it was added next to: the one selected
first, then the relation whose text reads most like the question (cosine of their features), then the
subgraph's edge order. The edges are the graph's own, as K-HOP-WITH-FILTERING extracted them, so a
path never names a fact the graph does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from seeder.data.ragged import ranges, segment_ids
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.retrieve.prior import OFF_PATH_TERM

WORDING_WEIGHT = 3.0
"""How much a walk's wording counts against the prior's mass in choosing a node's path: the log of the
mass ending there plus this times the summed cosines of the question to the walk's relations. The
prior learns from golden paths, and where one person directed and wrote a film both paths are golden
for "who directed X", so its mass does not tell them apart (0.55 written_by, 0.42 directed_by for
"who is the director that directed Swann in Love"); the relation's own text does. Chosen on MetaQA's
training questions (`benchmarks/bench_paths.py --split train`): 2 to 5 do alike, 10 lets the wording
override the prior's hop count."""


class PriorTerms(NamedTuple):
    """The relation-path prior's view of a call's questions (``RelationPathPrior.path_terms``)."""

    path: np.ndarray  # [Q, T] log mass of the vocabulary paths through or ending at each trie node
    ending: np.ndarray  # [Q, T] log mass of the paths ending at it
    children: np.ndarray  # [T, 2R] the trie node of (trie node, relation id), or -1


def expansion_paths(
    subgraphs: SubgraphSet,
    ranking: np.ndarray,
    steps: np.ndarray,
    relation_scores: np.ndarray | None = None,
    prior_terms: PriorTerms | None = None,
) -> tuple[np.ndarray, ...]:
    """For every (question, rank) of ``ranking`` [Q, L] (global node ids, -1 padded) with ``steps`` [Q, L]
    (0 for a seed, t + 1 for a node added at expansion step t, -1 outside the retrieved set), the path
    from a seed, as arrays [Q, L, D] over its D = max step hops, seed first, -1 padded:
    (from node, relation, forward, to node). ``forward`` is True where the hop follows the relation
    (from -relation-> to) and False where it goes against it (to -relation-> from). A seed's path is
    empty; so is that of a node outside the retrieved set. ``relation_scores`` [Q, 2R]: how well each
    relation id (r forward, r + R inverse) fits each question, to choose among a node's parent edges.
    ``prior_terms``: the prior's terms for these questions, which choose first."""
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
    if relation_scores is not None and len(child):
        fit = relation_scores[question, relation + np.where(along, 0, relation_scores.shape[1] // 2)]  # id as walked
    else:
        fit = np.zeros(len(child), np.float32)

    def per_child(candidates: np.ndarray, *keys: np.ndarray) -> np.ndarray:
        """The best of each child's candidate edges: by ``keys``, most significant last, then edge order."""
        order = np.lexsort((edge_index[candidates], *keys, child[candidates]))
        kids = child[candidates][order]
        return candidates[order[np.r_[True, kids[1:] != kids[:-1]]]] if len(order) else candidates

    first = per_child(np.arange(len(child)), -fit, step[parent])
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
    hops = (hops_from, hops_rel, hops_along, hops_to)
    if prior_terms is None:
        return hops
    # Where a walk spells one of the prior's paths, the likeliest such walk explains the node instead.
    walks = _prior_walks(subgraphs, step, node_query, head, tail, prior_terms, relation_scores)
    chosen = np.where(found & (steps > 0), walks.best_state[np.maximum(local, 0)], -1)  # [Q, L]: a walk, or -1
    return _overlay(hops, walks.hops(chosen, subgraphs.nodes), chosen >= 0)


@dataclass
class _Walks:
    """States of the prior-guided search: a (node, trie node) pair reached by a walk from a seed."""

    arc: np.ndarray  # [S] the last hop's (from, relation, forward, to) index into ``arcs``; -1 at a seed
    parent: np.ndarray  # [S] the state it came from; -1 at a seed
    level: np.ndarray  # [S] hops from the seed
    arcs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # flat local from, relation, forward, to
    best_state: np.ndarray  # [N] each flat subgraph node's explaining walk (``_prior_walks``), or -1

    def hops(self, chosen: np.ndarray, nodes: np.ndarray):
        """The walks of ``chosen`` [Q, L] states as hop arrays [Q, L, D], seed first."""
        depth = int(self.level.max(initial=0))
        out_from, out_rel = (np.full(chosen.shape + (depth,), -1, np.int64) for _ in range(2))
        out_along, out_to = np.zeros(chosen.shape + (depth,), bool), np.full(chosen.shape + (depth,), -1, np.int64)
        arc_from, arc_rel, arc_along, arc_to = self.arcs
        at = chosen
        for _ in range(depth):
            q, r = np.nonzero((at >= 0) & (self.arc[np.maximum(at, 0)] >= 0))
            state = at[q, r]
            arc, slot = self.arc[state], self.level[state] - 1
            out_from[q, r, slot] = nodes[arc_from[arc]]
            out_rel[q, r, slot] = arc_rel[arc]
            out_along[q, r, slot] = arc_along[arc]
            out_to[q, r, slot] = nodes[arc_to[arc]]
            at = np.where(at >= 0, self.parent[np.maximum(at, 0)], -1)
        return out_from, out_rel, out_along, out_to


def _prior_walks(subgraphs, step, node_query, head, tail, prior: PriorTerms, relation_scores=None) -> _Walks:
    """Walks from the seeds over edges between retrieved nodes that spell a prefix of a path of the prior's
    vocabulary, one hop a level (the trie is finite, so the levels are too). Of the walks that reach one
    (node, trie node) pair, which all spell the same relations, one that never went back along the edge it
    had just taken is kept, then the one through the parent selected first, then edge order.

    ``best_state`` picks each node's walk: the largest reading of its path, then a walk without such a
    step back, then the largest path term (the node read as one on the way), then the shorter walk; only
    walks whose path term is above the floor of paths off the prior count. A walk's reading is the log of
    the prior's mass of paths ending there (the node read as an answer of that path) plus
    ``WORDING_WEIGHT`` times the cosines of the question to the relations walked (``relation_scores``
    [Q, 2R]; none without them). A step back is the question's own logic where a seed's neighbour answers a longer
    path through the seed ("the films written by the writer of X" include X): it is kept, but any other
    walk as likely wins over it."""
    num_ids = prior.children.shape[1]
    inside = np.flatnonzero((step[head] >= 0) & (step[tail] >= 0))
    arc_from = np.concatenate([head[inside], tail[inside]])
    arc_edge = np.concatenate([inside, inside])
    grouped = np.lexsort((arc_edge, arc_from))  # arcs leaving one node together, in edge order
    arc_from, arc_edge = arc_from[grouped], arc_edge[grouped]
    arc_to = np.concatenate([tail[inside], head[inside]])[grouped]
    arc_along = np.r_[np.ones(len(inside), bool), np.zeros(len(inside), bool)][grouped]
    arc_rel = subgraphs.edge_rel[arc_edge].astype(np.int64)
    arc_walked = arc_rel + np.where(arc_along, 0, num_ids // 2)
    arc_ptr = np.searchsorted(arc_from, np.arange(len(step) + 1))

    seeds = np.flatnonzero(step == 0)
    node, trie = [seeds], [np.zeros(len(seeds), np.int64)]
    arc, parent, back = [np.full(len(seeds), -1)], [np.full(len(seeds), -1)], [np.zeros(len(seeds), bool)]
    wording = [np.zeros(len(seeds))]
    frontier, offset = np.arange(len(seeds)), len(seeds)
    while len(frontier):
        at, at_trie, at_arc = node[-1], trie[-1], arc[-1]
        counts = arc_ptr[at + 1] - arc_ptr[at]
        source = np.repeat(np.arange(len(at)), counts)
        hop = ranges(arc_ptr[at], counts)
        to_trie = prior.children[at_trie[source], arc_walked[hop]].astype(np.int64)
        keep = to_trie >= 0
        source, hop, to_trie = source[keep], hop[keep], to_trie[keep]
        came_by = np.where(at_arc[source] >= 0, arc_edge[np.maximum(at_arc[source], 0)], -1)
        backtracked = back[-1][source] | (arc_edge[hop] == came_by)
        # One state per (node, trie node): a walk that never went back along the edge it had just taken,
        # through the earliest-selected parent, then in edge order.
        pick = np.lexsort((hop, step[at[source]], backtracked, to_trie, arc_to[hop]))
        pair = np.stack([arc_to[hop][pick], to_trie[pick]])
        pick = pick[np.r_[True, (pair[:, 1:] != pair[:, :-1]).any(axis=0)]] if len(pick) else pick
        node.append(arc_to[hop[pick]])
        trie.append(to_trie[pick])
        arc.append(hop[pick])
        parent.append(frontier[source[pick]])
        back.append(backtracked[pick])
        if relation_scores is not None:
            walked_fit = relation_scores[node_query[at[source[pick]]], arc_walked[hop[pick]]]
        else:
            walked_fit = np.zeros(len(pick))
        wording.append(wording[-1][source[pick]] + walked_fit)
        frontier = offset + np.arange(len(pick))
        offset += len(pick)
    level = np.concatenate([np.full(len(n), hops, np.int64) for hops, n in enumerate(node)])
    node, trie, arc, parent, back, wording = (np.concatenate(x) for x in (node, trie, arc, parent, back, wording))
    question = node_query[node]
    term, ending = prior.path[question, trie], prior.ending[question, trie]
    valid = np.flatnonzero((level > 0) & (term > OFF_PATH_TERM))
    reading = ending[valid] + WORDING_WEIGHT * wording[valid]
    best = valid[np.lexsort((level[valid], -term[valid], back[valid], -reading, node[valid]))]
    first = best[np.r_[True, node[best][1:] != node[best][:-1]]] if len(best) else best
    best_state = np.full(len(step), -1, dtype=np.int64)
    best_state[node[first]] = first
    return _Walks(arc=arc, parent=parent, level=level, arcs=(arc_from, arc_rel, arc_along, arc_to), best_state=best_state)


def _overlay(hops, walk_hops, use_walk: np.ndarray):
    """``walk_hops`` where ``use_walk`` [Q, L], else ``hops``, padded to the deeper of the two."""
    depth = max(hops[0].shape[2], walk_hops[0].shape[2])

    def padded(array):
        fill = False if array.dtype == bool else -1
        return np.pad(array, ((0, 0), (0, 0), (0, depth - array.shape[2])), constant_values=fill)

    return tuple(np.where(use_walk[:, :, None], padded(w), padded(h)) for h, w in zip(hops, walk_hops))
