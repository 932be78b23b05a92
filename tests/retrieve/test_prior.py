"""The relation-path prior: targets, the trie's path terms, training, and K-HOP-WITH-FILTERING with it."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.config import ConfigError, ExpandConfig, PriorConfig
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.paths import ROOT, golden_paths
from seeder.retrieve.prior import PathTrie, RelationPathPrior, path_targets, train_prior


def test_targets_keep_paths_near_the_best_f1():
    query = np.array([0, 0, 0, 1])
    hits = np.array([4, 1, 2, 1])
    reached = np.array([4, 1, 40, 10])
    answers = np.array([4, 4, 4, 1])
    kept, weight, f1 = path_targets(query, np.arange(4), hits, reached, answers, keep_ratio=0.5)
    # Query 0: F1 1.0, 0.4, 0.09 -> only the first; query 1 keeps its only path.
    assert kept.tolist() == [0, 3]
    np.testing.assert_allclose(weight, [1.0, 2 * 0.1 / 1.1], rtol=1e-6)
    kept, _, _ = path_targets(query, np.arange(4), hits, reached, answers, keep_ratio=0.3)
    assert kept.tolist() == [0, 1, 3]


def test_path_terms_are_mass_through_plus_mass_ending_at_each_prefix():
    base = 4
    a, ab, ac, d = ROOT * base + 0, (ROOT * base + 0) * base + 1, (ROOT * base + 0) * base + 2, ROOT * base + 3
    vocab = np.array([a, ab, ac, d])
    trie = PathTrie.build(vocab, base)
    probs = np.array([[0.1, 0.5, 0.3, 0.1]], np.float32)
    terms = trie.path_terms(probs)[0]
    at = {int(c): float(v) for c, v in zip(trie.codes, terms)}
    assert at[ROOT] == pytest.approx(1.0)
    assert at[a] == pytest.approx(0.9 + 0.1)  # through a: a, ab, ac; ending at a: 0.1
    assert at[ab] == pytest.approx(0.5 + 0.5)
    assert at[d] == pytest.approx(0.1 + 0.1)
    root = 0
    assert trie.codes[trie.children[trie.children[root, 0], 1]] == ab
    assert trie.children[trie.children[root, 3], 0] == -1


def test_the_prior_learns_which_path_a_question_asks_for(tmp_path):
    rng = np.random.default_rng(0)
    types = np.array([(ROOT * 6 + 0) * 6 + 1, (ROOT * 6 + 1) * 6 + 0, ROOT * 6 + 4])
    kind = rng.integers(0, 3, 600)
    centres = rng.normal(size=(3, 16))
    features = centres[kind] + 0.3 * rng.normal(size=(600, 16))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    prior = train_prior(features.astype(np.float32), np.arange(600), types[kind], np.ones(600, np.float32),
                        np.arange(600) * 3 + 1, 6, PriorConfig(epochs=30, hidden_dim=32), echo=lambda _: None)
    assert prior.info["held_out_top1_is_target"] > 0.95
    top = prior.vocab[prior.probs(features).argmax(axis=1)]
    assert np.mean(top == types[kind]) > 0.95
    prior.save(tmp_path)
    again = RelationPathPrior.load(tmp_path)
    np.testing.assert_allclose(again.path_terms(features[:5]), prior.path_terms(features[:5]), rtol=1e-6)


def _order_graph(num_seeds: int):
    """Seeds with two relation-ordered trees: seed -A-> x -B-> answer-type nodes, and seed -B-> y -A->
    nodes of the other type. "the B of the A of s" and "the A of the B of s" name the same two relations,
    so only the order separates the right hop-2 nodes from the wrong ones."""
    from seeder.store import build_csr

    A, B = 0, 1
    src, dst, rel = [], [], []
    n = 0
    seeds, ab_nodes, ba_nodes = [], [], []
    for _ in range(num_seeds):
        s = n
        n += 1
        seeds.append(s)
        ab, ba = [], []
        for first, second, bucket in ((A, B, ab), (B, A, ba)):
            for _ in range(2):
                mid = n
                n += 1
                src.append(s), dst.append(mid), rel.append(first)
                for _ in range(3):
                    src.append(mid), dst.append(n), rel.append(second)
                    bucket.append(n)
                    n += 1
        ab_nodes.append(ab), ba_nodes.append(ba)
    csr = build_csr(n, 2, np.array(src), np.array(dst), np.array(rel))
    return csr, n, np.array(seeds), ab_nodes, ba_nodes


def test_learned_filter_beats_cosine_when_only_relation_order_differs():
    (indptr, neighbors, relations), n, seeds, ab_nodes, ba_nodes = _order_graph(80)
    rng = np.random.default_rng(1)
    d = 8
    # Query features: type AB -> e0, type BA -> e1. Both relations (and their inverses) have the same cosine
    # to every query, and node texts are orthogonal to the queries, so cosine cannot tell the trees apart.
    asks_ab = np.arange(80) % 2 == 0
    query_features = np.zeros((80, d), np.float32)
    query_features[asks_ab, 0] = 1
    query_features[~asks_ab, 1] = 1
    relation_features = np.zeros((4, d), np.float32)
    relation_features[:, :2] = 0.5
    relation_features[np.arange(4), 2 + np.arange(4)] = np.sqrt(0.5)
    node_features = np.zeros((n, d), np.float32)
    node_features[:, 6:] = rng.normal(size=(n, 2))
    node_features /= np.linalg.norm(node_features, axis=1, keepdims=True)
    answers = [a if ab else b for a, b, ab in zip(ab_nodes, ba_nodes, asks_ab)]
    answer_ptr = np.concatenate([[0], np.cumsum([len(a) for a in answers])])
    flat_answers = np.concatenate(answers)

    class KG:
        pass

    kg = KG()
    kg.indptr, kg.neighbors, kg.edge_relations, kg.num_relations, kg.num_nodes = indptr, neighbors, relations, 2, n
    train = np.arange(80) < 60
    found = golden_paths(indptr, neighbors, relations, 2, seeds[train][:, None], answer_ptr[: 61],
                         flat_answers[: answer_ptr[60]], 2, PriorConfig())
    kept, weight, _ = path_targets(found["query"], found["code"], found["hits"], found["reached"],
                                   np.diff(answer_ptr)[found["query"]], 0.5)
    prior = train_prior(query_features[train], found["query"][kept], found["code"][kept], weight, np.arange(60), 4,
                        PriorConfig(epochs=40, hidden_dim=16, lr=1e-2, min_count=1), echo=lambda _: None)

    def ceiling(relation_score):
        cfg = ExpandConfig(budget=11, hops=2, keep_per_hop=[4, 6], weights=[0.1, 0.1, 1.0], relation_score=relation_score)
        sub = expand_queries(kg, node_features, relation_features, query_features, seeds[:, None], np.zeros((80, 1)),
                             cfg, np.arange(80), np.array(["x"] * 80, object), answer_ptr, flat_answers, prior=prior)
        held_out = np.repeat(np.arange(80), sub.sizes) >= 60
        return sub.is_answer[held_out].sum() / (answer_ptr[80] - answer_ptr[60])  # recall, 20 held-out queries

    learned, cosine = ceiling("learned"), ceiling("cosine")
    assert learned == pytest.approx(1.0)
    assert cosine < 0.75
    with pytest.raises(ConfigError, match="relation-path prior"):
        expand_queries(kg, node_features, relation_features, query_features, seeds[:, None], np.zeros((80, 1)),
                       ExpandConfig(budget=11, hops=2, keep_per_hop=[4, 6], relation_score="learned"), np.arange(80),
                       np.array(["x"] * 80, object), answer_ptr, flat_answers)
