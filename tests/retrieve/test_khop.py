"""K-HOP-WITH-FILTERING against a brute-force reference, induced edges, caps and budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seeder.config import ConfigError, ExpandConfig
from seeder.retrieve.khop import GraphIndex, expand_batch, expand_queries

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
        kg,
        nf,
        rf,
        qf,
        seeds,
        np.zeros(seeds.shape, np.float32),
        cfg,
        query_ids=np.arange(num_q) * 10,
        splits=np.array(["val"] * num_q, dtype=object),
        answer_ptr=np.arange(num_q + 1),
        answers=np.arange(num_q),
        **kw,
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
    """A star with 5,000 leaves: only its sample of neighbor_cap leaves (the first entries of its CSR
    slice, in edge-hash order) is ever scored."""
    rng = np.random.default_rng(0)
    leaves = 5000
    n = leaves + 2
    src = np.concatenate([np.zeros(leaves, int), [1]])
    dst = np.concatenate([np.arange(2, n), [0]])
    kg = make_graph(tmp_path / "star", src, dst, np.zeros(len(src), int), n, 1)
    nf, rf, qf = normalised(rng, n, 8), normalised(rng, 2, 8), normalised(rng, 1, 8)
    cap = 100
    sample_list = np.asarray(kg.neighbors)[kg.indptr[0] : kg.indptr[0] + cap].tolist()
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
    # At hop 2 only the edges of the nodes added at hop 1 are read, so the seed's own edge does not
    # use up any of the cap: the hub (hop 1) gets all 30.
    cfg = ExpandConfig(budget=300, hops=2, keep_per_hop=[1, 299], neighbor_cap=cap, candidate_cap=30)
    got = run(kg, nf, rf, qf, np.array([[1]]), cfg)
    assert got.nodes[got.hop == 1].tolist() == [0]
    assert set(got.nodes[got.hop == 2].tolist()) == set(sample_list[:30])
    # Caps above the degree: all 5,001 neighbours are candidates, more than a query's first candidate
    # slots, so its table grows mid-hop; the selection is still the reference's.
    cfg = ExpandConfig(budget=300, hops=1, keep_per_hop=[299], neighbor_cap=10_000, candidate_cap=10_000)
    got = run(kg, nf, rf, qf, np.array([[0]]), cfg)
    want_nodes, _, want_scores = reference_expand(kg, nf, rf, qf, np.array([[0]]), cfg)[0]
    assert set(got.nodes.tolist()) == set(want_nodes) and got.nodes[0] == 0
    np.testing.assert_allclose(np.sort(got.score[1:]), np.sort(want_scores[1:]), atol=1e-5)
    assert (np.diff(got.score[1:]) <= 0).all()  # best first


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
    huge = dataclasses.replace(GraphIndex.build(kg), num_nodes=1 << 32)  # ids past the keys' 32 bits
    with pytest.raises(Exception, match="at most"):
        expand_batch(huge, nf, rf, qf, np.array([[1]]), ExpandConfig())


def test_cosines_do_not_depend_on_the_batch_and_descending_keys(random_graph):
    """A pair's cosine is computed by the same compiled code whatever the batch, so subgraphs and
    scores are bit-identical for any ``expand.batch_queries``; ranking keys order by (score
    descending, node ascending), -0.0 as 0.0, and give the node id back."""
    from seeder.retrieve.khop_kernels import descending_keys

    kg, _, rng = random_graph
    nf, rf, qf = normalised(rng, kg.num_nodes, 16), normalised(rng, 2 * kg.num_relations, 16), normalised(rng, 9, 16)
    seeds = rng.integers(0, kg.num_nodes, (9, 2))
    cfgs = [ExpandConfig(budget=15, hops=2, keep_per_hop=[5, 9], batch_queries=b) for b in (1, 4, 9)]
    runs = [run(kg, nf, rf, qf, seeds, cfg) for cfg in cfgs]
    for other in runs[1:]:
        for name in ("node_ptr", "nodes", "hop", "score", "edge_ptr", "edge_src", "edge_dst", "edge_rel"):
            np.testing.assert_array_equal(getattr(other, name), getattr(runs[0], name), err_msg=name)
    values = np.array([0.5, -0.5, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 0.5, 3.4e38, -3.4e38], np.float32)
    nodes = np.arange(len(values), dtype=np.int64)
    nodes[-1] = (1 << 32) - 1  # the largest id a key holds
    keys = descending_keys(values, nodes)
    assert np.argsort(keys).tolist() == [9, 4, 0, 8, 6, 2, 3, 7, 1, 5, 10]  # descending; ties by node id
    assert (keys & 0xFFFFFFFF).tolist() == nodes.tolist()


def test_no_queries_and_no_seeds(random_graph):
    kg, _, rng = random_graph
    nf, rf = normalised(rng, kg.num_nodes, 8), normalised(rng, 2 * kg.num_relations, 8)
    empty = run(kg, nf, rf, np.zeros((0, 8), np.float32), np.zeros((0, 3), np.int64), ExpandConfig())
    assert len(empty) == 0 and empty.node_ptr.tolist() == [0] and empty.edge_ptr.tolist() == [0]
    none = run(kg, nf, rf, normalised(rng, 2, 8), np.full((2, 3), -1), ExpandConfig())
    assert none.sizes.tolist() == [0, 0] and len(none.edge_src) == 0


@pytest.mark.parametrize("parent_term", ["similarity", "score"])
def test_exact_ties_break_by_node_id_as_the_reference(random_graph, parent_term):
    """When many scores tie exactly, the selection and its order are the brute-force reference's:
    ties go to the smaller node id, at every hop, including candidates carried from earlier hops."""
    kg, edges, rng = random_graph
    # Few distinct feature rows and relation rows: many candidates share their score exactly, so the
    # order rests on the id tie-break.
    nf = normalised(rng, 4, 8)[rng.integers(0, 4, kg.num_nodes)]
    rf = normalised(rng, 2, 8)[rng.integers(0, 2, 2 * kg.num_relations)]
    qf = normalised(rng, 9, 8)
    seeds = rng.integers(0, kg.num_nodes, (9, 3))
    # Unequal weights: with w1 = w2, u and v swapping feature rows tie in exact arithmetic but round
    # differently in float32 (the sum's order differs), which is no tie to break.
    cfg = ExpandConfig(
        budget=20, hops=3, keep_per_hop=[5, 6, 9], batch_queries=4, parent_term=parent_term, weights=[0.5, 0.3, 0.2]
    )
    got = run(kg, nf, rf, qf, seeds, cfg)
    assert len(np.unique(got.score)) < 0.6 * len(got.score)  # ties really happen
    for q, (nodes, hops, scores) in enumerate(reference_expand(kg, nf, rf, qf, seeds, cfg)):
        lo, hi = got.node_ptr[q], got.node_ptr[q + 1]
        assert got.nodes[lo:hi].tolist() == nodes
        assert got.hop[lo:hi].tolist() == hops
        np.testing.assert_allclose(got.score[lo:hi], scores, atol=1e-5)
        e_lo, e_hi = got.edge_ptr[q], got.edge_ptr[q + 1]
        edge_fields = (got.edge_src[e_lo:e_hi], got.edge_dst[e_lo:e_hi], got.edge_rel[e_lo:e_hi])
        as_global = [(nodes[s], nodes[d], int(r)) for s, d, r in zip(*edge_fields)]
        assert sorted(as_global) == sorted(induced_reference(edges, nodes))


def reference_expand_learned(kg, nf, qf, seeds, cfg, terms, children, ends):
    """The learned relation-path filter, per query, as plainly as possible: each selected node keeps
    the trie node of its best path; a hop reads only the edges of the previous hop's nodes (nothing
    carried); among a node's edges tied at its best term, the smallest trie node names its path.
    Also returns how often such a tie between different trie nodes came up."""
    from seeder.retrieve.prior import OFF_PATH_TERM

    indptr, nbrs, rels = np.asarray(kg.indptr), np.asarray(kg.neighbors), np.asarray(kg.edge_relations)
    w1, w2, w3 = cfg.weights
    out, tied_paths = [], 0
    for q in range(len(qf)):
        sim = lambda u: float(np.dot(nf[u].astype(np.float64), qf[q]))  # noqa: E731
        nodes, hops, scores, tries = [], [], [], []
        for s in seeds[q]:
            if s >= 0 and s not in nodes and len(nodes) < cfg.budget:
                nodes.append(int(s)), hops.append(0), scores.append(sim(s)), tries.append(0)
        parent = {v: sim(v) for v in nodes}
        trie_of = {v: 0 for v in nodes}
        frontier = list(nodes)
        for h in range(1, cfg.hops + 1):
            best = {}  # u -> (edge term, trie node)
            for v in frontier:
                for p in range(indptr[v], indptr[v + 1]):
                    u, r = int(nbrs[p]), int(rels[p])
                    if u in parent:
                        continue
                    child = int(children[trie_of[v], r]) if trie_of[v] >= 0 else -1
                    path = float(terms[q, child]) if child >= 0 else OFF_PATH_TERM
                    term = w2 * parent[v] + w3 * path
                    old = best.get(u)
                    tied_paths += old is not None and term == old[0] and child != old[1]
                    if old is None or term > old[0] or (term == old[0] and child < old[1]):
                        best[u] = (term, child)
            ranked = sorted(best, key=lambda u: (-(w1 * sim(u) + best[u][0]), u))
            room = min(cfg.keep_per_hop[h - 1], cfg.budget - len(nodes))
            frontier = ranked[:room]
            for u in frontier:
                score = w1 * sim(u) + best[u][0]
                nodes.append(u), hops.append(h), scores.append(score), tries.append(best[u][1])
                parent[u] = score if cfg.parent_term == "score" else sim(u)
                trie_of[u] = best[u][1]
        path_end = [float(ends[q, t]) if t >= 0 else OFF_PATH_TERM for t in tries]
        out.append((nodes, hops, scores, path_end))
    return out, tied_paths


@pytest.mark.parametrize("parent_term", ["similarity", "score"])
def test_learned_filter_matches_brute_force_reference_with_ties(random_graph, parent_term):
    """With the relation-path prior's terms: the same nodes, order, scores and path ends as the
    reference, with parents tied on their terms (the smallest trie node names a node's path)."""
    import seeder.retrieve.khop as khop

    kg, edges, rng = random_graph
    nf = normalised(rng, 3, 8)[rng.integers(0, 3, kg.num_nodes)]
    rf = normalised(rng, 2 * kg.num_relations, 8)
    qf, seeds = normalised(rng, 6, 8), rng.integers(0, kg.num_nodes, (6, 2))
    # A random trie over the 2R relation ids; path terms take 3 values, so parents tie on their terms.
    size = 40
    children = np.where(rng.random((size, 2 * kg.num_relations)) < 0.5, rng.integers(1, size, (size, 2 * kg.num_relations)), -1)
    terms = rng.choice(np.array([-1.0, -0.5, 0.0], np.float32), (len(qf), size))
    ends = rng.standard_normal((len(qf), size)).astype(np.float32)
    cfg = ExpandConfig(
        budget=16, hops=3, keep_per_hop=[4, 5, 7], relation_score="learned", parent_term=parent_term, weights=[0.5, 0.3, 0.2]
    )  # unequal: see test_exact_ties_break_by_node_id_as_the_reference
    got = khop.expand_batch(
        GraphIndex.build(kg), nf, rf, qf, seeds, cfg, path_terms=terms, trie_children=children, end_terms=ends
    )
    assert len(np.unique(got["path_end"])) < len(got["path_end"])  # nodes share a path
    want, tied_paths = reference_expand_learned(kg, nf, qf, seeds, cfg, terms, children, ends)
    assert tied_paths > 0  # the smallest-trie-node rule is exercised
    for q, (nodes, hops, scores, path_end) in enumerate(want):
        lo, hi = got["node_ptr"][q], got["node_ptr"][q + 1]
        assert got["nodes"][lo:hi].tolist() == nodes
        assert got["hop"][lo:hi].tolist() == hops
        np.testing.assert_allclose(got["score"][lo:hi], scores, atol=1e-5)
        np.testing.assert_array_equal(got["path_end"][lo:hi], np.float32(path_end))
        assert (got["query"][lo:hi] == q).all()
        e_lo, e_hi = got["edge_ptr"][q], got["edge_ptr"][q + 1]
        edge_fields = (got["edge_src"][e_lo:e_hi], got["edge_dst"][e_lo:e_hi], got["edge_rel"][e_lo:e_hi])
        as_global = [(nodes[s], nodes[d], int(r)) for s, d, r in zip(*edge_fields)]
        assert as_global == sorted(as_global, key=lambda e: (nodes.index(e[0]), nodes.index(e[1]), e[2]))
        assert set(as_global) == induced_reference(edges, nodes)


def test_each_hub_is_sampled_from_its_own_slice(tmp_path):
    """Two hubs above neighbor_cap: a seed at either one scores exactly its own sample, the first
    entries of its slice, which ``build_csr`` orders by edge hash (spread over the whole slice, not
    the leaves added first)."""
    rng = np.random.default_rng(1)
    a, b = 700, 900  # leaves of hub 0 and of hub 1
    n = 2 + a + b
    src = np.concatenate([np.zeros(a, int), np.ones(b, int)])
    dst = np.concatenate([np.arange(2, 2 + a), np.arange(2 + a, n)])
    kg = make_graph(tmp_path / "stars", src, dst, np.zeros(len(src), int), n, 1)
    nf, rf, qf = normalised(rng, n, 8), normalised(rng, 2, 8), normalised(rng, 1, 8)
    cap = 50
    cfg = ExpandConfig(budget=100, hops=1, keep_per_hop=[99], neighbor_cap=cap, candidate_cap=10_000)
    for hub, leaves in ((0, np.arange(2, 2 + a)), (1, np.arange(2 + a, n))):
        want = np.asarray(kg.neighbors)[kg.indptr[hub] : kg.indptr[hub] + cap]
        assert set(want.tolist()) <= set(leaves.tolist())
        assert np.percentile(leaves, 30) < np.median(want) < np.percentile(leaves, 70)
        got = run(kg, nf, rf, qf, np.array([[hub]]), cfg)
        assert set(got.nodes[got.hop == 1].tolist()) == set(want.tolist())
