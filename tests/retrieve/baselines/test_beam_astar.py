"""Beam traversal and A* on a graph whose best path is known."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.retrieve.baselines import astar, beam
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph
from tests.retrieve.baselines.helpers import baselines_config

from .helpers import with_cosines

S, A, B, C, T, D = range(6)


def _inputs():
    """S links to A (cosine 0.9) and B (0.5); A leads to C (0.1), B to T (1.0); D is off the graph's path.

    With transitions scored cos(q, v) + g(u) (relations orthogonal to the query, no hop penalty),
    the best 2-hop path is S -> B -> T (0.3 + 0.5 + 1.0); a greedy walk takes A first and misses T.
    """
    nodes, relations, query = with_cosines([0.3, 0.9, 0.5, 0.1, 1.0, 0.2])
    graph = InMemoryGraph.from_edges(6, 1, [S, S, A, B, D], [A, B, C, T, S], [0, 0, 0, 0, 0])
    return BaselineInputs(graph, nodes, relations, np.array([0]), query)


CFG = dict(beam__weights=[1.0, 0.0, 1.0], beam__hop_penalty=0.0, beam__hops=2)


@pytest.mark.parametrize("width, reaches_t", [(1, False), (2, True)])
def test_beam_needs_width_two_to_find_the_best_path(width, reaches_t):
    inputs = _inputs()
    q, node, score = beam.beam_search(inputs, np.array([[S]]), np.array([[0.3]]), baselines_config(beam__width=width, **CFG))
    best = dict(zip(node.tolist(), score.tolist()))
    assert (T in best) is reaches_t
    if reaches_t:
        assert best[T] == pytest.approx(1.8)
        assert max(best, key=best.get) == T
    else:
        assert best[C] == pytest.approx(1.3)  # the greedy path S -> A -> C


def test_beam_hop_penalty_and_relation_weight_enter_the_score():
    inputs = _inputs()
    cfg = baselines_config(beam__width=3, beam__weights=[1.0, 2.0, 0.5], beam__hop_penalty=0.25, beam__hops=2)
    _, node, score = beam.beam_search(inputs, np.array([[S]]), np.array([[0.3]]), cfg)
    best = dict(zip(node.tolist(), score.tolist()))
    # Relations are orthogonal to the query (cosine 0): T = 1.0 + 0.5 * (0.5 + 0.5 * 0.3 - 0.25) - 0.25.
    assert best[T] == pytest.approx(1.0 + 0.5 * (0.5 + 0.15 - 0.25) - 0.25)


def test_astar_expands_along_the_best_path():
    inputs = _inputs()
    cfg = baselines_config(astar__budget=10, astar__depth=2, astar__heuristic_weight=1.0, astar__discount=1.0, **CFG)
    trace = astar.astar_search(inputs, 0, np.array([S]), np.array([0.3]), cfg)
    # Priorities g + cos: S 0.6; A 1.2 + 0.9; B 0.8 + 0.5; C 1.3 + 0.1; T 1.8 + 1.0; D 0.5 + 0.2.
    assert trace.nodes.tolist() == [S, A, C, B, T, D]
    assert trace.path_to(T) == [S, B, T]
    assert trace.path_score[trace.nodes.tolist().index(T)] == pytest.approx(1.8)
    assert trace.depth.max() == 2


def test_astar_budget_and_depth_bound_the_search():
    inputs = _inputs()
    short = astar.astar_search(
        inputs, 0, np.array([S]), np.array([0.3]), baselines_config(astar__budget=3, astar__depth=2, astar__discount=1.0, **CFG)
    )
    assert short.nodes.tolist() == [S, A, C]
    # Left on the queue: B (priority 0.8 + 0.5) and D (0.5 + 0.2), best first.
    assert short.frontier.tolist() == [B, D]
    np.testing.assert_allclose(short.frontier_priority, [1.3, 0.7])
    shallow = astar.astar_search(
        inputs, 0, np.array([S]), np.array([0.3]), baselines_config(astar__budget=10, astar__depth=1, astar__discount=1.0, **CFG)
    )
    assert T not in shallow.nodes.tolist() and set(shallow.nodes.tolist()) == {S, A, B, D}


def test_retrievers_rank_reached_nodes_then_fill_by_cosine():
    inputs = _inputs()
    cfg = baselines_config(seeds=1, beam__width=2, astar__budget=4, astar__depth=2, astar__discount=1.0, **CFG)
    # The dense seed is T (cosine 1.0). Its only neighbour is B, whose only other neighbour is S:
    # path scores T 1.0, B 1.0 + 0.5, S 1.5 + 0.3. The rest follows by cosine: A, D, C.
    result = beam.retrieve(inputs, cfg, 6)
    assert result.set_size.tolist() == [3]
    assert result.ranking.tolist() == [[S, B, T, A, D, C]]
    # A* expands the same three (S at depth 2 stops); priorities S 2.1, B 2.0, T 2.0 (tie by id).
    result = astar.retrieve(inputs, cfg, 6)
    assert result.set_size.tolist() == [3]
    assert result.ranking.tolist() == [[S, B, T, A, D, C]]
