"""K-HOP-WITH-FILTERING against a brute-force reference, induced edges, caps and budget."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.config import ConfigError, ExpandConfig
from seeder.retrieve.khop import GraphIndex, expand_queries

from .conftest import make_graph, normalised


def reference_expand(kg, nf, rf, qf, seeds, cfg):
    """Per query, the method written as plainly as possible: scan every edge of every selected node."""
    indptr, nbrs, rels = np.asarray(kg.indptr), np.asarray(kg.neighbors), np.asarray(kg.edge_relations)
    w1, w2, w3 = cfg.weights
    out = []
    for q in range(len(qf)):
        sim = lambda u: float(np.dot(nf[u].astype(np.float64), qf[q]))  # noqa: E731
        nodes, hops, scores = [], [], []
        for s in seeds[q]:
            if s >= 0 and s not in nodes and len(nodes) < cfg.budget:
                nodes.append(int(s)), hops.append(0), scores.append(sim(s))
        sims = {v: sim(v) for v in nodes}
        parent = dict(sims)  # what the w2 term reads: sim(q,v), or v's filter score
        for h in range(1, cfg.hops + 1):
            best = {}
            for v in nodes:
                for p in range(indptr[v], indptr[v + 1]):
                    u, r = int(nbrs[p]), int(rels[p])
                    if u in sims:
                        continue
                    term = w2 * parent[v] + w3 * float(np.dot(rf[r].astype(np.float64), qf[q]))
                    best[u] = max(best.get(u, -np.inf), term)
            ranked = sorted(best, key=lambda u: (-(w1 * sim(u) + best[u]), u))
            room = min(cfg.keep_per_hop[h - 1], cfg.budget - len(nodes))
            for u in ranked[:room]:
                nodes.append(u), hops.append(h), scores.append(w1 * sim(u) + best[u])
                sims[u] = sim(u)
                parent[u] = scores[-1] if cfg.parent_term == "score" else sims[u]
        out.append((nodes, hops, scores))
    return out


def run(kg, nf, rf, qf, seeds, cfg, **kw):
    num_q = len(qf)
    return expand_queries(
        kg, nf, rf, qf, seeds, np.zeros(seeds.shape, np.float32), cfg,
        query_ids=np.arange(num_q) * 10, splits=np.array(["val"] * num_q, dtype=object),
        answer_ptr=np.arange(num_q + 1), answers=np.arange(num_q), **kw,
    )


def induced_reference(edges, nodes):
    src, dst, rel = edges
    members = set(nodes)
    return {(int(s), int(d), int(r)) for s, d, r in zip(src, dst, rel) if s in members and d in members}


@pytest.mark.parametrize("parent_term", ["similarity", "score"])
@pytest.mark.parametrize("heavy_degree", [256, 4])
@pytest.mark.parametrize("keep", [[4, 9], [3, 5, 6]])
def test_matches_brute_force_reference(random_graph, keep, heavy_degree, parent_term):
    kg, edges, rng = random_graph
    nf, rf = normalised(rng, kg.num_nodes, 16), normalised(rng, 2 * kg.num_relations, 16)
    qf = normalised(rng, 7, 16)
    seeds = rng.integers(0, kg.num_nodes, (7, 3))
    seeds[0, 1] = seeds[0, 0]  # duplicate seed
    seeds[1, 2] = -1  # padding
    seeds[2] = [5, 9, -1]  # both hubs
    cfg = ExpandConfig(budget=14, hops=len(keep), keep_per_hop=keep, batch_queries=3, parent_term=parent_term)
    got = run(kg, nf, rf, qf, seeds, cfg, graph=GraphIndex.build(kg, heavy_degree=heavy_degree))
    assert (kg.degree()[[5, 9]] > 4).all()
    want = reference_expand(kg, nf, rf, qf, seeds, cfg)
    for q, (nodes, hops, scores) in enumerate(want):
        lo, hi = got.node_ptr[q], got.node_ptr[q + 1]
        assert got.nodes[lo:hi].tolist() == nodes
        assert got.hop[lo:hi].tolist() == hops
        np.testing.assert_allclose(got.score[lo:hi], scores, atol=1e-5)
        assert hi - lo <= cfg.budget
        # Induced edges: exactly the graph's directed edges among the selected nodes, each once.
        e_lo, e_hi = got.edge_ptr[q], got.edge_ptr[q + 1]
        pairs = list(zip(got.edge_src[e_lo:e_hi], got.edge_dst[e_lo:e_hi], got.edge_rel[e_lo:e_hi]))
        as_global = [(nodes[s], nodes[d], int(r)) for s, d, r in pairs]
        assert len(as_global) == len(set(as_global))
        assert set(as_global) == induced_reference(edges, nodes)
        assert all(r < kg.num_relations for _, _, r in as_global)
        assert got.is_answer[lo:hi].tolist() == [n == q for n in nodes]
    assert got.query_ids.tolist() == [0, 10, 20, 30, 40, 50, 60]


def test_seeds_first_with_hop_zero_and_budget(random_graph):
    kg, _, rng = random_graph
    nf, rf = normalised(rng, kg.num_nodes, 8), normalised(rng, 2 * kg.num_relations, 8)
    qf = normalised(rng, 4, 8)
    seeds = np.array([[3, 7, 11], [5, -1, -1], [20, 21, 22], [-1, -1, -1]])
    cfg = ExpandConfig(budget=10, hops=2, keep_per_hop=[8, 8])
    got = run(kg, nf, rf, qf, seeds, cfg)
    sizes = got.sizes
    assert sizes.tolist()[:3] == [10, 10, 10] and sizes[3] == 0
    for q in range(3):
        hop = got.hop[got.node_ptr[q] : got.node_ptr[q + 1]]
        n_seeds = (seeds[q] >= 0).sum()
        assert (hop[:n_seeds] == 0).all() and (hop[n_seeds:] > 0).all()
        assert np.all(np.diff(hop) >= 0)
        assert got.nodes[got.node_ptr[q] : got.node_ptr[q] + n_seeds].tolist() == seeds[q][:n_seeds].tolist()
        np.testing.assert_allclose(
            got.score[got.node_ptr[q] : got.node_ptr[q] + n_seeds], nf[seeds[q][:n_seeds]] @ qf[q], atol=1e-6
        )


def test_caps_bound_the_work_on_a_hub(tmp_path):
    """A star with 5,000 leaves: only a stride sample of neighbor_cap leaves is ever scored."""
    rng = np.random.default_rng(0)
    leaves = 5000
    n = leaves + 2
    src = np.concatenate([np.zeros(leaves, int), [1]])
    dst = np.concatenate([np.arange(2, n), [0]])
    kg = make_graph(tmp_path / "star", src, dst, np.zeros(len(src), int), n, 1)
    nf, rf, qf = normalised(rng, n, 8), normalised(rng, 2, 8), normalised(rng, 1, 8)
    degree = int(kg.degree()[0])
    cap = 100
    sample_list = np.asarray(kg.neighbors)[kg.indptr[0] + (np.arange(cap) * degree) // cap].tolist()
    sample = set(sample_list)
    cfg = ExpandConfig(budget=300, hops=1, keep_per_hop=[299], neighbor_cap=cap, candidate_cap=10_000)
    got = run(kg, nf, rf, qf, np.array([[0]]), cfg)
    hop1 = set(got.nodes[got.hop == 1].tolist())
    assert len(hop1) == cap and hop1 == sample
    # candidate_cap: edges from the best (first) source first; the cap truncates the rest.
    cfg = ExpandConfig(budget=300, hops=1, keep_per_hop=[299], neighbor_cap=cap, candidate_cap=30)
    got = run(kg, nf, rf, qf, np.array([[0, 1]]), cfg)
    hop1 = set(got.nodes[got.hop == 1].tolist())
    assert hop1 == set(sample_list[:30])  # a prefix of the hub's own sample; node 1 gets no room


def test_bad_config_and_seeds(random_graph):
    kg, _, rng = random_graph
    nf, rf, qf = normalised(rng, kg.num_nodes, 8), normalised(rng, 2 * kg.num_relations, 8), normalised(rng, 1, 8)
    with pytest.raises(ConfigError, match="keep_per_hop"):
        run(kg, nf, rf, qf, np.array([[1]]), ExpandConfig(hops=3, keep_per_hop=[1, 2]))
    with pytest.raises(ConfigError, match="parent_term"):
        run(kg, nf, rf, qf, np.array([[1]]), ExpandConfig(parent_term="path"))
    with pytest.raises(Exception, match="not a node"):
        run(kg, nf, rf, qf, np.array([[kg.num_nodes + 3]]), ExpandConfig())
    with pytest.raises(Exception, match="2R"):
        run(kg, nf, rf[:2], qf, np.array([[1]]), ExpandConfig())


def test_cosine_paths_agree_and_descending_keys():
    from seeder.retrieve.khop import _descending_bits, node_query_cosines

    rng = np.random.default_rng(5)
    nf, qf = normalised(rng, 300, 16), normalised(rng, 20, 16)
    # Nodes 0..9 appear for every query (the shared-product path), the rest once each.
    nodes = np.concatenate([np.tile(np.arange(10), 20), rng.integers(10, 300, 400)])
    rows = np.concatenate([np.repeat(np.arange(20), 10), rng.integers(0, 20, 400)])
    want = np.einsum("ij,ij->i", nf[nodes].astype(np.float64), qf[rows].astype(np.float64))
    for shared in (True, False):
        np.testing.assert_allclose(node_query_cosines(nf, nodes, qf, rows, 64, shared), want, atol=1e-6)
    # The chunk is a cache setting: each pair's sum is the same whatever the chunk, to the bit, so
    # subgraphs do not depend on it.
    gathered = node_query_cosines(nf, nodes, qf, rows, share_frequent=False)
    for chunk in (1, 7, 64, 4096):
        np.testing.assert_array_equal(node_query_cosines(nf, nodes, qf, rows, chunk, False), gathered)
    values = np.array([0.5, -0.5, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 0.5], np.float32)
    order = np.argsort(_descending_bits(values), kind="stable")
    assert order.tolist() == [4, 0, 8, 6, 2, 3, 7, 1, 5]  # descending; equal values keep input order


def test_no_queries_and_no_seeds(random_graph):
    kg, _, rng = random_graph
    nf, rf = normalised(rng, kg.num_nodes, 8), normalised(rng, 2 * kg.num_relations, 8)
    empty = run(kg, nf, rf, np.zeros((0, 8), np.float32), np.zeros((0, 3), np.int64), ExpandConfig())
    assert len(empty) == 0 and empty.node_ptr.tolist() == [0] and empty.edge_ptr.tolist() == [0]
    none = run(kg, nf, rf, normalised(rng, 2, 8), np.full((2, 3), -1), ExpandConfig())
    assert none.sizes.tolist() == [0, 0] and len(none.edge_src) == 0


@pytest.mark.parametrize("parent_term", ["similarity", "score"])
def test_packed_sorts_equal_the_long_way_with_ties(random_graph, monkeypatch, parent_term):
    """The packed-key sorts (max per node, top b_h, induced edges) select exactly what the lexsort /
    stable-argsort fallback selects, in the same order, when many scores tie exactly."""
    import seeder.retrieve.khop as khop

    kg, _, rng = random_graph
    # Few distinct feature rows and relation rows: many candidates share their score exactly, so the
    # order rests on the id tie-break.
    nf = normalised(rng, 4, 8)[rng.integers(0, 4, kg.num_nodes)]
    rf = normalised(rng, 2, 8)[rng.integers(0, 2, 2 * kg.num_relations)]
    qf = normalised(rng, 9, 8)
    seeds = rng.integers(0, kg.num_nodes, (9, 3))
    cfg = ExpandConfig(budget=20, hops=3, keep_per_hop=[5, 6, 9], batch_queries=4, parent_term=parent_term)
    fast = run(kg, nf, rf, qf, seeds, cfg)
    assert len(np.unique(fast.score)) < 0.6 * len(fast.score)  # ties really happen
    monkeypatch.setattr(khop, "_packed_keys", lambda fields: None)
    slow = run(kg, nf, rf, qf, seeds, cfg)
    for name in ("node_ptr", "nodes", "hop", "score", "edge_ptr", "edge_src", "edge_dst", "edge_rel"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_learned_filter_packed_sort_equals_the_long_way_with_ties(random_graph, monkeypatch):
    """With the relation-path prior's terms, the packed (key, edge term) argsort picks each node's
    best edge and, among edges tied at it, the smallest trie node, exactly as the three-key lexsort."""
    import seeder.retrieve.khop as khop

    kg, _, rng = random_graph
    nf = normalised(rng, 3, 8)[rng.integers(0, 3, kg.num_nodes)]
    rf = normalised(rng, 2 * kg.num_relations, 8)
    qf, seeds = normalised(rng, 6, 8), rng.integers(0, kg.num_nodes, (6, 2))
    # A random trie over the 2R relation ids; path terms take 3 values, so parents tie on their terms.
    size = 40
    children = np.where(rng.random((size, 2 * kg.num_relations)) < 0.5, rng.integers(1, size, (size, 2 * kg.num_relations)), -1)
    terms = rng.choice(np.array([-1.0, -0.5, 0.0], np.float32), (len(qf), size))
    ends = rng.standard_normal((len(qf), size)).astype(np.float32)
    cfg = ExpandConfig(budget=16, hops=3, keep_per_hop=[4, 5, 7], relation_score="learned")
    graph = GraphIndex.build(kg)

    def expand():
        return khop.expand_batch(graph, nf, rf, qf, seeds, cfg, path_terms=terms, trie_children=children, end_terms=ends)

    fast = expand()
    assert len(np.unique(fast["path_end"])) < len(fast["path_end"])  # nodes share a path
    monkeypatch.setattr(khop, "_packed_keys", lambda fields: None)
    slow = expand()
    for name in ("node_ptr", "nodes", "hop", "score", "path_end", "edge_src", "edge_dst", "edge_rel"):
        np.testing.assert_array_equal(fast[name], slow[name], err_msg=name)


def test_descending_bits_round_trip():
    from seeder.retrieve.khop import _descending_bits, _from_descending_bits

    values = np.array([0.5, -0.5, 0.0, 1.0, -1.0, 1e-30, -1e-30, 3.4e38, -3.4e38], np.float32)
    np.testing.assert_array_equal(_from_descending_bits(_descending_bits(values)), values)
