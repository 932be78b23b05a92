"""benchmarks/bench_limits.py: following one relation path and reaching within h hops, against brute
force on a small random graph (the script is loaded from its file: benchmarks/ is not a package)."""

from __future__ import annotations

import numpy as np

from seeder.data.store import build_csr
from tests.benchmarks import load_script


def small_graph(seed: int = 0, nodes: int = 30, edges: int = 80, relations: int = 3):
    rng = np.random.default_rng(seed)
    src, dst, rel = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges), rng.integers(0, relations, edges)
    indptr, neighbors, relation_ids = build_csr(nodes, relations, src, dst, rel)
    return indptr, neighbors, relation_ids


def test_follow_matches_a_walk_edge_by_edge():
    limits = load_script("bench_limits")
    indptr, neighbors, relations = small_graph()
    start = np.array([0, 5, -1, 17, 5])
    for path in ([1], [0, 4], [2, 3, 1]):  # ids >= 3 are inverse relations
        q, node = limits.follow(indptr, neighbors, relations, start, path)
        got = {(int(a), int(b)) for a, b in zip(q, node)}
        want = set()
        for row, s in enumerate(start):
            frontier = {int(s)} if s >= 0 else set()
            for r in path:
                frontier = {int(neighbors[p]) for v in frontier for p in range(indptr[v], indptr[v + 1]) if relations[p] == r}
            want |= {(row, v) for v in frontier}
        assert got == want
        assert len(got) == len(q)  # deduplicated


def test_reach_any_is_a_bfs_to_each_rows_own_depth():
    limits = load_script("bench_limits")
    indptr, neighbors, _ = small_graph(seed=1)
    n = len(indptr) - 1
    start = np.array([2, 9, -1, 2])
    hops = np.array([1, 2, 3, 3])
    keys = set(limits.reach_any(indptr, neighbors, start, hops).tolist())
    want = set()
    for row, (s, h) in enumerate(zip(start, hops)):
        if s < 0:
            continue
        seen = frontier = {int(s)}
        for _ in range(h):
            frontier = {int(neighbors[p]) for v in frontier for p in range(indptr[v], indptr[v + 1])} - seen
            seen = seen | frontier
        want |= {row * n + v for v in seen}
    assert keys == want
