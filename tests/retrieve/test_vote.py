"""Labelled questions vote for their relation paths (seeder.retrieve.vote), inside the prior."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.retrieve.paths import ROOT
from seeder.retrieve.prior import RelationPathPrior
from seeder.retrieve.vote import NEAREST, LabelledVote
from tests.retrieve.conftest import fixed_prior

BASE = 4
VOCAB = np.array([ROOT * BASE + r for r in range(BASE)])  # the four one-relation paths


def _vote(features, question, code, weight, temperature=0.05, floor=0.01):
    return LabelledVote.build(
        np.asarray(features, np.float32), np.asarray(question), np.asarray(code), np.asarray(weight), VOCAB, temperature, floor
    )


def test_votes_are_the_kernel_weighted_shares_of_the_neighbours_targets():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(5, 6)).astype(np.float32)
    # Question rows 0, 2, 3 are labelled; row 2 has two targets (weights 3 and 1); row 3's path is unknown to the prior.
    vote = _vote(features, [0, 2, 2, 3], VOCAB[[1, 0, 3]].tolist() + [ROOT * BASE**2 + 5], [1.0, 3.0, 1.0, 1.0])
    assert vote.size == 2  # row 3 keeps no target the prior can score
    readings = rng.normal(size=(3, 6)).astype(np.float32)
    got = vote.votes(readings, len(VOCAB))
    unit = lambda x: x / np.linalg.norm(x)  # noqa: E731
    for q in range(3):
        k0 = np.exp((unit(readings[q]) @ unit(features[0]) - 1) / 0.05)
        k2 = np.exp((unit(readings[q]) @ unit(features[2]) - 1) / 0.05)
        np.testing.assert_allclose(got[q], [0.75 * k2, k0, 0, 0.25 * k2], rtol=1e-5, atol=1e-12)


def _prior_preferring(path: int) -> RelationPathPrior:
    """A "path" prior whose MLP puts most mass on one path whatever the question (the profile is all ones)."""
    d = 3
    b2 = np.zeros(len(VOCAB), np.float32)
    b2[path] = 2.0
    return fixed_prior(VOCAB, BASE, d + BASE, b2)


def test_a_question_worded_like_a_labelled_one_takes_its_path_and_one_unlike_any_keeps_the_priors(tmp_path):
    prior = _prior_preferring(0)
    labelled = np.eye(3, dtype=np.float32)[:2]  # two labelled questions, both asking for path 2
    prior.vote = _vote(labelled, [0, 1], VOCAB[[2, 2]], [1.0, 1.0])
    near = np.array([[1.0, 0.05, 0.0]], np.float32)  # worded like the first
    far = np.array([[0.0, 0.0, 1.0]], np.float32)  # like neither
    profile = np.ones((1, BASE), np.float32)
    without = _prior_preferring(0).probs(np.concatenate([far, profile], axis=1))
    assert prior.probs(np.concatenate([near, profile], axis=1)).argmax() == 2
    # Far from every labelled question each vote is exp(-1 / 0.05): the prior's probabilities stand.
    np.testing.assert_allclose(prior.probs(np.concatenate([far, profile], axis=1)), without, rtol=1e-6)
    prior.save(tmp_path)
    loaded = RelationPathPrior.load(tmp_path)
    assert loaded.vote is not None and loaded.vote.temperature == 0.05 and loaded.vote.floor == 0.01
    np.testing.assert_array_equal(
        loaded.probs(np.concatenate([near, profile], axis=1)), prior.probs(np.concatenate([near, profile], axis=1))
    )
    # Saving a prior without a vote into the same directory leaves no stale vote behind.
    _prior_preferring(0).save(tmp_path)
    assert RelationPathPrior.load(tmp_path).vote is None


def test_only_the_nearest_labelled_questions_vote():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(NEAREST + 20, 8)).astype(np.float32)
    vote = _vote(
        features, np.arange(len(features)), VOCAB[np.arange(len(features)) % BASE], np.ones(len(features)), temperature=1.0
    )
    reading = rng.normal(size=(1, 8)).astype(np.float32)
    got = vote.votes(reading, len(VOCAB))[0]
    sim = (reading / np.linalg.norm(reading)) @ (features / np.linalg.norm(features, axis=1, keepdims=True)).T
    nearest = np.argsort(-sim[0])[:NEAREST]
    expected = np.zeros(BASE)
    np.add.at(expected, nearest % BASE, np.exp(sim[0, nearest] - 1))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got.sum() == pytest.approx(expected.sum(), rel=1e-5)
