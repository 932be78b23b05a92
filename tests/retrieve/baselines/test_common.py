"""Ego graphs, grouped top-k and full rankings against direct computations on small graphs."""

from __future__ import annotations

import numpy as np

from seeder.retrieve.baselines.common import (
    dense_topk,
    ego_graphs,
    first_occurrences,
    full_ranking,
    group_topk,
)

from .helpers import random_inputs


def _neighbourhood(inputs, seeds, hops):
    """Plain BFS over both directions (the oracle)."""
    g = inputs.graph
    reached = set(int(s) for s in seeds if s >= 0)
    frontier = set(reached)
    for _ in range(hops):
        nxt = set()
        for u in frontier:
            nxt.update(int(v) for v in g.neighbors[g.indptr[u] : g.indptr[u + 1]])
        frontier = nxt - reached
        reached |= frontier
    return reached


def test_ego_graphs_without_caps_are_the_khop_neighbourhood_and_its_induced_edges():
    inputs = random_inputs(seed=1, n=120, e=200)
    seeds, _ = dense_topk(inputs.query_features, inputs.node_features, 2)
    ego = ego_graphs(inputs, seeds, hops=2, neighbor_cap=10**6, max_nodes=10**6)
    g = inputs.graph
    r = g.num_relations
    for qi in range(len(seeds)):
        lo, hi = ego.offsets[qi], ego.offsets[qi + 1]
        nodes = ego.node[lo:hi]
        expected = _neighbourhood(inputs, seeds[qi], 2)
        assert set(nodes.tolist()) == expected
        assert np.all(np.diff(nodes) > 0)
        in_q = ego.edge_query == qi
        got = {
            (int(ego.node[h]), int(t_r), int(ego.node[t]))
            for h, t_r, t in zip(ego.edge_head[in_q], ego.edge_relation[in_q], ego.edge_tail[in_q])
        }
        out = np.asarray(g.edge_relations) < r
        heads = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
        want = {
            (int(u), int(rr), int(v))
            for u, v, rr in zip(heads[out], np.asarray(g.neighbors)[out], np.asarray(g.edge_relations)[out])
            if u in expected and v in expected
        }
        assert got == want


def test_ego_graphs_respect_the_node_bound_and_keep_seeds():
    inputs = random_inputs(seed=2)
    seeds, _ = dense_topk(inputs.query_features, inputs.node_features, 3)
    ego = ego_graphs(inputs, seeds, hops=2, neighbor_cap=5, max_nodes=12)
    sizes = np.diff(ego.offsets)
    assert sizes.max() <= 12 and sizes.min() >= 3
    for qi in range(len(seeds)):
        nodes = ego.node[ego.offsets[qi] : ego.offsets[qi + 1]]
        assert set(seeds[qi].tolist()) <= set(nodes.tolist())
        hop = ego.hop[ego.offsets[qi] : ego.offsets[qi + 1]]
        assert set(nodes[hop == 0].tolist()) == set(seeds[qi].tolist())


def test_group_topk_and_first_occurrences():
    group = np.array([1, 0, 1, 0, 1, 0])
    score = np.array([0.5, 0.2, 0.9, 0.2, 0.1, 0.7])
    picked = group_topk(group, score, np.arange(6), 2)
    assert picked.tolist() == [5, 1, 2, 0]  # group 0: 0.7, then the tie 0.2 by lower index; group 1: 0.9, 0.5
    rows = np.array([[3, 1, 3, -1, 2, 1], [5, 5, 5, 4, -1, -1]])
    assert first_occurrences(rows).tolist() == [[3, 1, 2, -1, -1, -1], [5, 4, -1, -1, -1, -1]]


def test_full_ranking_puts_method_nodes_first_then_dense_order():
    inputs = random_inputs(seed=3, q=2)
    dense, _ = dense_topk(inputs.query_features, inputs.node_features, 10)
    own = np.array([[dense[0, 5], 17, -1], [4, 4, 8]])
    result = full_ranking(inputs, own, np.array([2, 2]), 10)
    assert result.ranking[0, :2].tolist() == [dense[0, 5], 17]
    rest = [v for v in dense[0].tolist() if v not in (dense[0, 5], 17)][:8]
    assert result.ranking[0, 2:].tolist() == rest
    assert result.ranking[1, :2].tolist() == [4, 8]
    assert result.set_size.tolist() == [2, 2]
