"""G-Retriever's prizes by hand and its PCST against brute force over all subtrees of tiny graphs."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from seeder.retrieve.baselines import gretriever
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph
from tests.retrieve.baselines.helpers import baselines_config

from .helpers import with_cosines


def test_edge_prizes_follow_g_retriever_tiers():
    sim = np.array([0.9, 0.9, 0.8, 0.7, 0.1, 0.5, 0.6])
    query = np.array([0, 0, 0, 0, 0, 1, 1])
    prizes = gretriever.edge_prizes(query, sim, 2)
    # Query 0: tier 0 holds two edges: min(2/2, 2 - 0.01) = 1 each; tier 1: min(1/1, 1*0.99 - 0.01) = 0.98.
    # Query 1: tier 0 is 0.6 alone: min(2, 1.99) = 1.99; tier 1: min(1, 1.99*0.99 - 0.01).
    np.testing.assert_allclose(prizes, [1.0, 1.0, 0.98, 0.0, 0.0, 1.0, 1.99])


def test_node_prizes_rank_the_top_nodes():
    from seeder.retrieve.baselines.common import EgoGraphs

    ego = EgoGraphs(
        query=np.array([0, 0, 0, 0, 1, 1]),
        node=np.array([1, 2, 3, 4, 1, 5]),
        hop=np.zeros(6, np.int64),
        sim=np.array([0.1, 0.9, 0.5, 0.7, 0.3, 0.2]),
        offsets=np.array([0, 4, 6]),
        edge_head=np.zeros(0, np.int64),
        edge_tail=np.zeros(0, np.int64),
        edge_relation=np.zeros(0, np.int64),
        edge_query=np.zeros(0, np.int64),
    )
    assert gretriever.node_prizes(ego, 3).tolist() == [0, 3, 1, 2, 3, 2]


def _tree_value(edges, prizes, costs, vertices, chosen):
    return prizes[list(vertices)].sum() - costs[list(chosen)].sum()


def _brute_force(num_vertices, edges, prizes, costs):
    """Best value of a connected vertex set minus the minimum spanning tree of its induced edges."""
    best = max(prizes)  # a single vertex is a tree
    for size in range(2, num_vertices + 1):
        for subset in itertools.combinations(range(num_vertices), size):
            inside = set(subset)
            g = nx.Graph()
            g.add_nodes_from(subset)
            for (u, v), c in zip(edges, costs):
                if u in inside and v in inside and (not g.has_edge(u, v) or g[u][v]["weight"] > c):
                    g.add_edge(u, v, weight=c)
            if nx.is_connected(g):
                mst = nx.minimum_spanning_tree(g)
                best = max(best, prizes[list(subset)].sum() - sum(d["weight"] for _, _, d in mst.edges(data=True)))
    return best


def _solve(num_nodes, heads, tails, node_prize, edge_prize, cost=0.5):
    edges, prizes, costs, cheap, rich = gretriever.pcst_inputs(num_nodes, heads, tails, node_prize, edge_prize, cost)
    import pcst_fast

    vertices, chosen = pcst_fast.pcst_fast(edges, prizes, costs, -1, 1, "gw", 0)
    return edges, prizes, costs, np.asarray(vertices), np.asarray(chosen)


@pytest.mark.parametrize(
    "heads, tails, node_prize, edge_prize, expected_nodes",
    [
        # Path 0-1-2-3: prizes at both ends; the cheap middle edges are worth crossing.
        ([0, 1, 2], [1, 2, 3], [3, 0, 0, 2], [0.0, 0.0, 0.0], {0, 1, 2, 3}),
        # Star: the hub links three leaves; only two leaves pay for their edge.
        ([0, 0, 0], [1, 2, 3], [0, 1, 0.2, 2], [0.0, 0.0, 0.0], {0, 1, 3}),
        # A rich edge (prize 1 > cost 0.5) joins an otherwise prize-less pair to the tree.
        ([0, 1, 2], [1, 2, 3], [2, 0, 0, 0], [0.0, 1.0, 0.0], {0, 1, 2}),
    ],
)
def test_pcst_finds_the_optimum_on_hand_made_trees(heads, tails, node_prize, edge_prize, expected_nodes):
    heads, tails = np.array(heads), np.array(tails)
    node_prize, edge_prize = np.array(node_prize, float), np.array(edge_prize, float)
    edges, prizes, costs, vertices, chosen = _solve(4, heads, tails, node_prize, edge_prize)
    assert _tree_value(edges, prizes, costs, vertices, chosen) == pytest.approx(_brute_force(len(prizes), edges, prizes, costs))
    nodes, _ = gretriever.solve_pcst(4, heads, tails, node_prize, edge_prize, 0.5, 1, "gw")
    assert set(nodes.tolist()) == expected_nodes


@pytest.mark.parametrize("seed", range(12))
def test_pcst_on_random_tiny_graphs_is_a_tree_within_the_gw_bound(seed):
    rng = np.random.default_rng(seed)
    n = 6
    pairs = np.array([p for p in itertools.combinations(range(n), 2) if rng.random() < 0.45]).reshape(-1, 2)
    node_prize = np.where(rng.random(n) < 0.5, rng.integers(1, 4, n), 0).astype(float)
    edge_prize = np.where(rng.random(len(pairs)) < 0.3, rng.uniform(0, 1.2, len(pairs)), 0.0)
    edges, prizes, costs, vertices, chosen = _solve(n, pairs[:, 0], pairs[:, 1], node_prize, edge_prize)
    # A tree: connected, |edges| = |vertices| - 1, edges only among the chosen vertices.
    tree = nx.Graph()
    tree.add_nodes_from(vertices.tolist())
    tree.add_edges_from(edges[chosen].tolist())
    assert set(tree.nodes) == set(vertices.tolist())
    assert nx.is_tree(tree)
    value = _tree_value(edges, prizes, costs, vertices, chosen)
    optimum = _brute_force(len(prizes), edges, prizes, costs)
    assert value <= optimum + 1e-9
    # GW's guarantee is on the penalty form: tree cost + prizes left out <= 2 x the optimum's.
    total = prizes.sum()
    assert (total - value) <= 2 * (total - optimum) + 1e-9


@pytest.mark.parametrize(
    "edge_cost, pruning, expected",
    [
        (0.4, "gw", [0, 1, 2, 3]),
        (0.6, "strong", [0, 1]),
        # GW pruning keeps a branch whose prize grew its moat even when the branch nets a loss
        # (1 - 2 x 0.6 < 0): G-Retriever's default is a 2-approximation, not the optimum.
        (0.6, "gw", [0, 1, 2, 3]),
    ],
)
def test_retrieve_selects_the_tree_around_the_best_nodes(edge_cost, pruning, expected):
    # Prizes 3, 2, 1 on nodes 0, 1, 2; only the best edge 0-1 gets an edge prize (0.99, a virtual
    # node). Node 2 hangs off 0 through the prize-less bridge 3: worth its two edges only when they
    # cost less than its prize of 1. Node 5 (no prize) hangs off 0, and 4 off 5.
    cos = [0.95, 0.9, 0.85, 0.2, 0.1, 0.05]
    nodes, relations, query = with_cosines(cos)
    graph = InMemoryGraph.from_edges(6, 1, [0, 3, 0, 4, 5], [3, 2, 1, 5, 0], [0, 0, 0, 0, 0])
    inputs = BaselineInputs(graph, nodes, relations, np.array([7]), query)
    cfg = baselines_config(gretriever__edge_cost=edge_cost, gretriever__topk_edges=1, gretriever__pruning=pruning)
    result = gretriever.retrieve(inputs, cfg, 6)
    assert result.set_size.tolist() == [len(expected)]
    assert result.ranking[0, : len(expected)].tolist() == expected
    assert sorted(result.ranking[0].tolist()) == list(range(6))
