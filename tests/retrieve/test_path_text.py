"""Relation paths written as questions and matched against the question (seeder.retrieve.path_text)."""

from __future__ import annotations

import numpy as np

from seeder.features.embed import apply_pca, fit_pca, l2_normalize
from seeder.retrieve.path_text import PathText, choose_weight, relation_tail_types, render_paths
from seeder.retrieve.paths import encode
from seeder.retrieve.prior import RelationPathPrior
from tests.retrieve.conftest import fixed_prior

# Two relations, four ids: 0 "directed by" (movie -> person), 1 "has genre" (movie -> genre), 2 and 3 their inverses.
TEXTS = ["directed by", "has genre", "directed", "genre of"]
BASE = 4


def code(*relations: int) -> int:
    return encode(list(relations), BASE)


def test_tail_types_are_each_relation_ids_commonest_target_type():
    types = np.array(["movie", "movie", "person", "genre", "person", None], dtype=object)
    # CSR edges (relation id, neighbour): directed by -> persons 2, 4 and once the movie 1; has genre -> 3.
    relations = np.array([0, 0, 0, 1, 2, 2, 3])
    neighbors = np.array([2, 4, 1, 3, 0, 1, 0])
    tails = relation_tail_types(neighbors, relations, types, 6)
    assert tails.tolist() == ["person", "genre", "movie", "movie", "node", "node"]  # ids 4, 5: no edge


def test_a_path_reads_from_the_answer_back_to_the_seed_by_inverse_texts():
    tails = np.array(["person", "genre", "movie", "movie"], dtype=object)
    paths = np.array([code(0), code(0, 2), code(0, 2, 1), code(3)])
    assert render_paths(paths, BASE, TEXTS, tails) == [
        "which person directed the movie",
        "which movie directed by the person directed the movie",
        "which genre genre of the movie directed by the person directed the movie",
        "which movie has genre the genre",
    ]


def _pca(rng, dim, width):
    return fit_pca(l2_normalize(rng.normal(size=(400, width)) + 0.3), dim)


def test_the_cosine_is_recovered_from_the_pca_features_the_prior_keeps():
    rng = np.random.default_rng(0)
    questions, paths = l2_normalize(rng.normal(size=(5, 8)) + 0.3), l2_normalize(rng.normal(size=(7, 8)) + 0.3)
    raw = questions @ paths.T
    full = _pca(rng, 8, 8)  # keeps every direction: exact
    np.testing.assert_allclose(PathText.build(paths, full).cosine(apply_pca(questions, full)), raw, atol=1e-5)
    np.testing.assert_allclose(PathText.build(paths, None).cosine(questions), raw, atol=1e-6)
    # Dropping directions loses only what they held: closer than the projected features' own cosine.
    part = _pca(rng, 6, 8)
    got = PathText.build(paths, part).cosine(apply_pca(questions, part))
    naive = apply_pca(questions, part) @ apply_pca(paths, part).T
    assert np.abs(got - raw).mean() < np.abs(naive - raw).mean()


def test_reweigh_multiplies_by_the_exponentiated_match_and_keeps_empty_paths_empty():
    text = PathText.build(np.eye(3, dtype=np.float32), None, weight=2.0)
    probs = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], np.float32)
    features = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
    want = probs * np.exp(2.0 * features)
    np.testing.assert_allclose(text.reweigh(probs, features), want / want.sum(axis=1, keepdims=True), rtol=1e-6)
    assert text.reweigh(probs, features)[0, 2] == 0
    assert text.reweigh(probs, features, weight=0.0) is probs


def test_the_weight_is_chosen_where_the_match_helps_and_zero_where_it_misleads():
    rng = np.random.default_rng(1)
    n, paths = 400, 3
    truth = rng.integers(paths, size=n)
    # The prior is right on half the questions and uniform-ish wrong on the rest.
    probs = np.full((n, paths), 0.2, np.float32)
    right = rng.random(n) < 0.5
    probs[np.arange(n), np.where(right, truth, (truth + 1) % paths)] = 0.6
    keys = np.arange(n) * paths + truth
    features = np.eye(paths, dtype=np.float32)
    helpful = PathText.build(np.eye(paths, dtype=np.float32), None)
    weight, shares = choose_weight(probs, helpful, features[truth], keys)
    assert shares[0.0] < 0.6 and weight > 0 and shares[weight] > 0.95
    misleading = features[(truth + 2) % paths]  # the text points at a wrong path
    weight, shares = choose_weight(probs, helpful, misleading, keys)
    assert weight == 0.0 and shares[0.0] > shares[80.0]


def test_a_prior_saves_its_path_text_and_its_probabilities_use_it(tmp_path):
    vocab = np.array([code(r) for r in range(BASE)])
    d = 3
    prior = fixed_prior(vocab, BASE, d + BASE)
    inputs = np.concatenate([np.array([[0.0, 0.0, 1.0]], np.float32), np.ones((1, BASE), np.float32)], axis=1)
    np.testing.assert_allclose(prior.probs(inputs), 0.25)
    paths = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]], np.float32)
    prior.path_text = PathText.build(paths, None, weight=5.0)
    prior.save(tmp_path)
    loaded = RelationPathPrior.load(tmp_path)
    assert loaded.path_text.weight == 5.0
    assert loaded.probs(inputs).argmax() == 2  # the question reads like path 2
    loaded.path_text = None
    loaded.save(tmp_path)
    assert not (tmp_path / "path_text.npz").exists() and RelationPathPrior.load(tmp_path).path_text is None
