"""The words next to a question's seed and asking word against a path's first and last relation
(seeder.retrieve.local_match)."""

from __future__ import annotations

import numpy as np

from seeder.retrieve.local_match import WINDOW, LocalMatch, choose_weights, question_windows
from seeder.retrieve.paths import encode
from seeder.retrieve.prior import RelationPathPrior
from tests.retrieve.conftest import fixed_prior

BASE = 4  # relation ids 0 starred (movie -> person), 1 directed (movie -> person), 2 and 3 their inverses


def code(*relations: int) -> int:
    return encode(list(relations), BASE)


def test_windows_keep_the_words_either_side_of_the_seed_and_of_the_asking_word():
    assert WINDOW == 3
    seed_side, asking = question_windows(
        [
            "who directed films that share actors with the film Delhi-6",
            "the films written by the screenwriter of The Limey were directed by who",
            "Delhi-6 actors",
            "nothing asked here",
        ],
        [["Delhi-6"], ["The Limey"], ["Delhi-6"], []],
        [["movie"], ["movie"], [None], []],
    )
    assert seed_side == [
        "with the film the movie",
        "the screenwriter of the movie were directed by",
        "X actors",
        "",
    ]
    assert asking == ["who directed films that", "were directed by who", "", ""]


def test_the_windows_reweigh_paths_by_their_first_and_last_relations(tmp_path):
    # One-hop sentences of the four relation ids, in a 4-d feature space: starred, directed, and inverses.
    relations = np.eye(4, dtype=np.float32)
    vocab = np.array([code(0, 2, 1), code(1, 2, 0)])  # starred -> starred in -> directed; directed -> starred in -> starred
    match = LocalMatch.build(relations, vocab, BASE, offset=1)
    assert match.first.tolist() == [0, 1] and match.last.tolist() == [1, 0]
    # "who directed films that share actors with the movie": the seed window reads "starred", the asking one "directed".
    inputs = np.zeros((1, 1 + 8 + BASE), np.float32)
    inputs[0, 1 + 0] = 1.0  # seed window = starred
    inputs[0, 1 + 4 + 1] = 1.0  # asking window = directed
    probs = np.array([[0.4, 0.6]], np.float32)  # the prior prefers the wrong order
    assert match.reweigh(probs, inputs) is probs  # weights 0: unchanged
    out = match.reweigh(probs, inputs, (2.0, 2.0))
    expected = probs[0] * np.exp([4.0, 0.0])
    np.testing.assert_allclose(out[0], expected / expected.sum(), rtol=1e-5)
    empty = np.zeros_like(inputs)
    np.testing.assert_allclose(match.reweigh(probs, empty, (2.0, 2.0)), probs, rtol=1e-6)  # empty windows: no say

    # The weights: the largest pair as good as the best on held-out questions (targets: path 0).
    keys = np.array([0])
    (seed_weight, ask_weight), shares = choose_weights(probs, match, inputs, keys, weights=(0.0, 1.0, 5.0))
    assert shares[(0.0, 0.0)] == 0.0 and shares[(5.0, 5.0)] == 1.0 and (seed_weight, ask_weight) == (5.0, 5.0)

    # The prior's MLP skips the window columns; the match reweighs its probabilities; both survive save/load.
    prior = fixed_prior(vocab, BASE, 1 + BASE, np.log(probs[0]))  # the MLP reads the first column and the profile only
    inputs[0, -BASE:] = 1.0  # every relation leaves the seed
    match.seed_weight, match.ask_weight = 2.0, 2.0
    prior.local_match = match
    prior.save(tmp_path)
    loaded = RelationPathPrior.load(tmp_path)
    assert (loaded.local_match.offset, loaded.local_match.seed_weight, loaded.local_match.ask_weight) == (1, 2.0, 2.0)
    np.testing.assert_allclose(loaded.probs(inputs), out, rtol=1e-5)
    loaded.local_match = None
    loaded.save(tmp_path)
    assert not (tmp_path / "local_match.npz").exists() and RelationPathPrior.load(tmp_path).local_match is None
