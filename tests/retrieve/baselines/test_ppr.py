"""Personalized PageRank against networkx and a dense power iteration; PPR relevance on a small graph."""

from __future__ import annotations

import networkx as nx
import numpy as np

from seeder.config import BaselinesConfig
from seeder.retrieve.baselines import ppr
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph

from .helpers import with_cosines


def _random_digraph(rng, n, e):
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    pairs = {(int(a), int(b)) for a, b in zip(src, dst) if a != b}  # simple graph: networkx merges repeats
    return np.array(sorted(pairs)).reshape(-1, 2)


def test_ppr_matches_networkx_on_a_disjoint_union_with_dangling_nodes():
    rng = np.random.default_rng(0)
    sizes = [7, 11, 5]
    groups, srcs, dsts, restarts, graphs = [], [], [], [], []
    base = 0
    for gi, n in enumerate(sizes):
        edges = _random_digraph(rng, n, 2 * n)
        restart = np.zeros(n)
        restart[rng.choice(n, 2, replace=False)] = rng.uniform(0.2, 1.0, 2)
        restart /= restart.sum()
        groups.append(np.full(n, gi))
        srcs.append(edges[:, 0] + base)
        dsts.append(edges[:, 1] + base)
        restarts.append(restart)
        graphs.append((n, edges, restart))
        base += n
    got = ppr.personalized_pagerank(
        base, np.concatenate(groups), np.concatenate(srcs), np.concatenate(dsts), np.concatenate(restarts), 0.15, 300
    )
    start = dangling = 0
    for n, edges, restart in graphs:
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from(map(tuple, edges))
        dangling += sum(g.out_degree(v) == 0 for v in g)
        want = nx.pagerank(g, alpha=0.85, personalization=dict(enumerate(restart)), tol=1e-13, max_iter=1000)
        np.testing.assert_allclose(got[start : start + n], [want[v] for v in range(n)], atol=1e-9)
        start += n
    assert dangling > 0, "the oracle check must exercise dangling nodes"


def test_ppr_twenty_iterations_equal_a_dense_power_iteration():
    rng = np.random.default_rng(1)
    n = 9
    edges = _random_digraph(rng, n, 14)
    edges = np.concatenate([edges, edges[:, ::-1]])  # undirected, as the ego graph is walked
    restart = np.zeros(n)
    restart[[0, 4]] = [0.7, 0.3]
    # Dense oracle: column-stochastic transition matrix, dangling mass back to the restart vector.
    adjacency = np.zeros((n, n))
    np.add.at(adjacency, (edges[:, 0], edges[:, 1]), 1.0)
    degree = adjacency.sum(1)
    transition = np.where(degree[:, None] > 0, adjacency / np.maximum(degree, 1)[:, None], restart[None, :])
    x = restart.copy()
    for _ in range(20):
        x = 0.85 * transition.T @ x + 0.15 * restart
    got = ppr.personalized_pagerank(n, np.zeros(n, dtype=np.int64), edges[:, 0], edges[:, 1], restart, 0.15, 20)
    np.testing.assert_allclose(got, x, atol=1e-12)
    assert abs(got.sum() - 1.0) < 1e-9


def test_ppr_relevance_prefers_the_node_the_seeds_share():
    # Seeds 0 and 1 (highest cosine). Node 2 links to both seeds, node 3 to one; same cosine.
    cos = [0.9, 0.85, 0.3, 0.3, 0.1]
    nodes, relations, query = with_cosines(cos)
    graph = InMemoryGraph.from_edges(5, 1, [0, 1, 0, 3], [2, 2, 3, 4], [0, 0, 0, 0])
    inputs = BaselineInputs(graph, nodes, relations, np.array([42]), query)
    cfg = BaselinesConfig(seeds=2)
    ego, relevance = ppr.ppr_relevance(inputs, cfg)
    by_node = dict(zip(ego.node.tolist(), relevance.tolist()))
    assert by_node[2] > by_node[3]
    result = ppr.retrieve(inputs, cfg, 5)
    assert result.query_ids.tolist() == [42]
    assert result.set_size.tolist() == [5]  # the whole 2-hop ego graph
    assert result.ranking[0, :2].tolist() == [0, 1] or result.ranking[0, :2].tolist() == [1, 0]
    assert result.ranking[0].tolist().index(2) < result.ranking[0].tolist().index(3)
