"""The relation-path prior: targets, the trie's path terms, training, and K-HOP-WITH-FILTERING with it."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.config import ConfigError, ExpandConfig, PriorConfig
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.paths import ROOT, golden_paths
from seeder.retrieve.prior import (
    PathTrie,
    RelationPathPrior,
    held_out_questions,
    holdout_mask,
    path_targets,
    prior_inputs,
    seed_relation_profile,
    train_prior,
)
from tests.retrieve.conftest import fixed_prior


def test_targets_keep_paths_near_the_best_f1():
    query = np.array([0, 0, 0, 1])
    hits = np.array([4, 1, 2, 1])
    reached = np.array([4, 1, 40, 10])
    answers = np.array([4, 4, 4, 1])
    codes = ROOT * 4 + np.arange(4)
    kept, weight, f1 = path_targets(query, codes, hits, reached, answers, 0.5, 4)
    # Query 0: F1 1.0, 0.4, 0.09 -> only the first; query 1 keeps its only path.
    assert kept.tolist() == [0, 3]
    np.testing.assert_allclose(weight, [1.0, 2 * 0.1 / 1.1], rtol=1e-6)
    kept, _, _ = path_targets(query, codes, hits, reached, answers, 0.3, 4)
    assert kept.tolist() == [0, 1, 3]
    # A longer path to as many nodes and answers as a shorter one is a detour, not a target.
    # Relations 0, 1 and inverses 2, 3: "0 -> 2 -> 1" steps straight back; "1" reaches the same 3 nodes.
    r1, back, other = ROOT * 4 + 1, ((ROOT * 4 + 0) * 4 + 2) * 4 + 1, ((ROOT * 4 + 0) * 4 + 1) * 4 + 1
    kept, _, _ = path_targets(
        np.zeros(3, int), np.array([r1, back, other]), np.array([2, 2, 2]), np.array([3, 3, 3]), np.array([2, 2, 2]), 0.5, 4
    )
    assert kept.tolist() == [0]  # a longer path to as many nodes (a coincidence) is not a target either
    kept, _, _ = path_targets(
        np.zeros(2, int), np.array([r1, back]), np.array([2, 2]), np.array([4, 3]), np.array([2, 2]), 0.5, 4
    )
    assert kept.tolist() == [0, 1]  # the step back reaches other nodes (and is the best path): not a detour
    # A longer path than the shortest best one is a coincidence, even at the same F1; a shorter, weaker
    # path stays a target beside a longer best one.
    kept, _, _ = path_targets(
        np.zeros(3, int),
        np.array([r1, other, ROOT * 4 + 0]),
        np.array([1, 1, 1]),
        np.array([1, 1, 2]),
        np.array([1, 1, 1]),
        0.5,
        4,
    )
    assert kept.tolist() == [0, 2]


def test_generated_questions_are_held_out_by_whole_phrasings_and_real_ones_by_their_id_hash():
    ids = np.arange(1000, 3000)
    phrasings = np.where(ids < 2000, -1, ids % 10)  # the first 1,000 real, the rest from 10 templates
    held = held_out_questions(ids, 0.1, phrasings, seed=0)
    made = phrasings >= 0
    held_kinds = set(phrasings[made & held].tolist())
    assert len(held_kinds) == 1  # a tenth of 10 phrasings: one, all of its questions
    assert held[made & np.isin(phrasings, list(held_kinds))].all()
    assert np.array_equal(held[~made], holdout_mask(ids[~made], 0.1))
    assert 0.05 < held[~made].mean() < 0.15
    # Seeded: the same phrasing for the same seed; another seed may choose another.
    assert np.array_equal(held, held_out_questions(ids, 0.1, phrasings, seed=0))
    chosen = {int(phrasings[made & held_out_questions(ids, 0.1, phrasings, seed=s)][0]) for s in range(8)}
    assert len(chosen) > 1
    # Three tenths of 10 phrasings are three of them.
    assert len(set(phrasings[made & held_out_questions(ids, 0.3, phrasings)].tolist())) == 3
    # One phrasing only: holding it out would leave nothing to fit, so its questions are hashed like real ones.
    single = np.zeros(len(ids), np.int64)
    assert np.array_equal(held_out_questions(ids, 0.1, single), holdout_mask(ids, 0.1))
    # Without phrasings (a dataset of real questions), the hash as before.
    assert np.array_equal(held_out_questions(ids, 0.1), holdout_mask(ids, 0.1))


def test_path_terms_are_mass_through_plus_mass_ending_at_each_prefix():
    base = 4
    a, ab, ac, d = ROOT * base + 0, (ROOT * base + 0) * base + 1, (ROOT * base + 0) * base + 2, ROOT * base + 3
    vocab = np.array([a, ab, ac, d])
    trie = PathTrie.build(vocab, base)
    probs = np.array([[0.1, 0.5, 0.3, 0.1]], np.float32)
    terms, ending = (x[0] for x in trie.path_terms(probs))
    at = {int(c): float(v) for c, v in zip(trie.codes, terms)}
    ends = {int(c): float(v) for c, v in zip(trie.codes, ending)}
    assert ends[ROOT] == 0 and ends[a] == pytest.approx(0.1) and ends[ab] == pytest.approx(0.5)
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
    features = prior_inputs(features, np.ones((600, 6)))
    prior = train_prior(
        features,
        np.arange(600),
        types[kind],
        np.ones(600, np.float32),
        np.arange(600) * 3 + 1,
        6,
        PriorConfig(epochs=30, hidden_dim=32),
        echo=lambda _: None,
    )
    assert prior.info["held_out_top1_is_target"] > 0.95
    top = prior.vocab[prior.probs(features).argmax(axis=1)]
    assert np.mean(top == types[kind]) > 0.95
    prior.save(tmp_path)
    again = RelationPathPrior.load(tmp_path)
    for loaded, trained in zip(again.path_terms(features[:5]), prior.path_terms(features[:5])):
        np.testing.assert_allclose(loaded, trained, rtol=1e-6)


def test_a_heavier_question_weight_wins_where_two_kinds_of_question_read_alike():
    # 500 questions of one kind and 50 of another with the same features but another target path: with
    # equal weights the many win; weighted 20x, the few do (their share of the loss is then 2 to 1).
    rng = np.random.default_rng(1)
    features = prior_inputs(np.tile(rng.normal(size=(1, 8)), (550, 1)) + 0.01 * rng.normal(size=(550, 8)), np.ones((550, 6)))
    few = np.arange(550) >= 500
    paths = np.where(few, ROOT * 6 + 2, ROOT * 6 + 3)

    def top_path(question_weight):
        prior = train_prior(
            features,
            np.arange(550),
            paths,
            np.ones(550, np.float32),
            np.arange(550) * 7 + 3,
            6,
            PriorConfig(epochs=20, hidden_dim=16),
            echo=lambda _: None,
            question_weight=question_weight,
        )
        return np.bincount(prior.vocab[prior.probs(features).argmax(axis=1)] - ROOT * 6, minlength=6).argmax()

    assert top_path(None) == 3
    assert top_path(np.where(few, 20.0, 1.0)) == 2


def _order_graph(num_seeds: int):
    """Seeds with two relation-ordered trees: seed -A-> x -B-> answer-type nodes, and seed -B-> y -A->
    nodes of the other type. "the B of the A of s" and "the A of the B of s" name the same two relations,
    so only the order separates the right hop-2 nodes from the wrong ones."""
    from seeder.data.store import build_csr

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
    found = golden_paths(
        indptr, neighbors, relations, 2, seeds[train][:, None], answer_ptr[:61], flat_answers[: answer_ptr[60]], 2, PriorConfig()
    )
    kept, weight, _ = path_targets(
        found["query"], found["code"], found["hits"], found["reached"], np.diff(answer_ptr)[found["query"]], 0.5, 4
    )
    inputs = prior_inputs(query_features, seed_relation_profile(indptr, relations, seeds[:, None], 4))
    prior = train_prior(
        inputs[train],
        found["query"][kept],
        found["code"][kept],
        weight,
        np.arange(60),
        4,
        PriorConfig(epochs=40, hidden_dim=16, lr=1e-2, min_count=1),
        echo=lambda _: None,
    )

    def ceiling(relation_score):
        cfg = ExpandConfig(budget=11, hops=2, keep_per_hop=[4, 6], weights=[0.1, 0.1, 1.0], relation_score=relation_score)
        sub = expand_queries(
            kg,
            node_features,
            relation_features,
            query_features,
            seeds[:, None],
            np.zeros((80, 1)),
            cfg,
            np.arange(80),
            np.array(["x"] * 80, object),
            answer_ptr,
            flat_answers,
            prior=prior,
        )
        held_out = np.repeat(np.arange(80), sub.sizes) >= 60
        return sub.is_answer[held_out].sum() / (answer_ptr[80] - answer_ptr[60]), sub, held_out  # recall, 20 held-out

    (learned, sub, held_out), (cosine, cosine_sub, _) = ceiling("learned"), ceiling("cosine")
    assert learned == pytest.approx(1.0)
    assert cosine < 0.75
    # The policy's path-end feature: the prior's ending mass separates the answers from the rest of the
    # subgraph (seeds and hop-1 nodes lie on a prefix, not at a path's end); 0 with the cosine filter.
    ends = sub.path_end[held_out]
    assert ends[sub.is_answer[held_out]].min() > ends[~sub.is_answer[held_out]].max()
    assert not cosine_sub.path_end.any()
    with pytest.raises(ConfigError, match="relation-path prior"):
        expand_queries(
            kg,
            node_features,
            relation_features,
            query_features,
            seeds[:, None],
            np.zeros((80, 1)),
            ExpandConfig(budget=11, hops=2, keep_per_hop=[4, 6], relation_score="learned"),
            np.arange(80),
            np.array(["x"] * 80, object),
            answer_ptr,
            flat_answers,
        )


def test_seed_profile_masks_paths_the_seed_cannot_start():
    from seeder.data.store import build_csr

    # Node 0 has only out-edges of relation 0; node 3 only in-edges of relation 1 (id 1 + R = 3).
    indptr, _, relations = build_csr(4, 2, np.array([0, 2]), np.array([1, 3]), np.array([0, 1]))
    profile = seed_relation_profile(indptr, relations, np.array([[0, -1], [3, -1], [-1, -1]]), 4)
    assert profile.tolist() == [[1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    vocab = np.array([ROOT * 4 + 0, ROOT * 4 + 3, (ROOT * 4 + 0) * 4 + 1])
    d = 2
    prior = fixed_prior(vocab, 4, d + 4)
    np.testing.assert_array_equal(prior.first_relation, [0, 3, 0])
    probs = prior.probs(prior_inputs(np.zeros((3, d)), profile))
    np.testing.assert_allclose(probs, [[0.5, 0, 0.5], [0, 1, 0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-6)


@pytest.mark.parametrize("model", ["hops", "path"])
def test_per_hop_prior_generalises_to_unseen_compositions(model):
    # Questions "the b of the a of X": features one-hot the first relation (dims 0-2) and the second (3-5).
    rng = np.random.default_rng(3)
    base = 6
    a, b = rng.integers(0, 3, 900), rng.integers(0, 3, 900)
    features = np.zeros((900, 6), np.float32)
    features[np.arange(900), a] = 1
    features[np.arange(900), 3 + b] = 1
    codes = (ROOT * base + a) * base + (b + 3)
    seen = (a + b) % 3 != 0  # (0,0), (1,2), (2,1) never occur in training
    inputs = prior_inputs(features, np.ones((900, base)))
    prior = train_prior(
        inputs[seen],
        np.arange(int(seen.sum())),
        codes[seen],
        np.ones(int(seen.sum()), np.float32),
        np.arange(int(seen.sum())),
        base,
        PriorConfig(model=model, epochs=60, hidden_dim=32, lr=1e-2),
        echo=lambda _: None,
    )
    top = prior.vocab[prior.probs(inputs[~seen]).argmax(axis=1)]
    accuracy = float(np.mean(top == codes[~seen]))
    if model == "hops":
        assert accuracy > 0.95
    else:
        assert accuracy == 0.0  # a whole-path vocabulary has no entry for a composition it never saw


def test_the_refit_drops_paths_that_reach_the_answers_by_coincidence():
    """Every question has its real path (set by its type) and one random path of the same F1, as on a
    graph of permutations; only the real one follows the question across the training set."""
    rng = np.random.default_rng(5)
    base, n = 6, 900
    kind = rng.integers(0, 3, n)
    real = (ROOT * base + kind) * base + kind + 3
    decoy = (ROOT * base + rng.integers(0, 6, n)) * base + rng.integers(0, 6, n)
    decoy = np.where(decoy == real, (ROOT * base + 5) * base + 5, decoy)
    features = np.eye(3, dtype=np.float32)[kind] + 0.1 * rng.normal(size=(n, 3)).astype(np.float32)
    inputs = prior_inputs(features, np.ones((n, base)))
    query = np.repeat(np.arange(n), 2)
    codes = np.stack([real, decoy], 1).reshape(-1)
    order = np.lexsort((codes, query))

    def real_mass(rounds):
        cfg = PriorConfig(model="path", min_count=1, epochs=40, hidden_dim=32, lr=1e-2, refine_rounds=rounds)
        prior = train_prior(
            inputs, query[order], codes[order], np.ones(2 * n, np.float32), np.arange(n), base, cfg, echo=lambda _: None
        )
        probs = prior.probs(inputs)
        return float(np.mean(probs[np.arange(n), np.searchsorted(prior.vocab, real)]))

    once, refit = real_mass(0), real_mass(1)
    assert refit > once + 0.2  # decoys keep about half the mass after one fit; the refit takes it back
