"""The question's wording around its topic entity, as the relation-path prior reads it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seeder.config import ConfigError, PriorConfig
from seeder.retrieve.paths import ROOT
from seeder.retrieve.prior import RelationPathPrior, prior_inputs, train_prior
from seeder.retrieve.wording import ENTITY, MASK_WORD, mask_entities, masked_questions, question_form, seed_names
from tests.retrieve.conftest import fixed_prior


def test_seed_names_are_masked_whole_longest_first():
    masked = mask_entities(
        ["Who directed Cars 2?", "what films did [Joel Zwick] direct", "who directed Scars", "no seed here"],
        [["Cars", "Cars 2"], ["Joel Zwick"], ["Cars"], []],
    )
    assert masked == [f"who directed {ENTITY}", f"what films did {ENTITY} direct", "who directed scars", "no seed here"]


def test_a_masked_question_names_each_seed_by_its_type():
    texts = ["Who directed The Matrix Reloaded and The Matrix?", "films by Ann Lee"]
    names = [["The Matrix", "The Matrix Reloaded"], ["Ann Lee"]]
    masked = masked_questions(texts, names, [["movie", "film"], [""]])
    assert masked == ["who directed the film and the movie", f"films by {MASK_WORD}"]


def test_features_depend_on_the_wording_not_on_the_entity():
    texts = ["who directed Kismet", "who directed The Big Lebowski", "what did Kismet direct", ""]
    names = [["Kismet"], ["The Big Lebowski"], ["Kismet"], []]
    form = question_form(texts, names, 256)
    assert form.shape == (4, 256) and form.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(form[:3], axis=1), 1.0, rtol=1e-5)
    assert not form[3].any()
    np.testing.assert_array_equal(form[0], form[1])  # another title, the same question
    assert float(form[0] @ form[2]) < 0.9  # the same words around the entity in another order
    np.testing.assert_array_equal(question_form(texts, names, 256), form)  # deterministic


def test_a_question_has_the_same_features_alone_and_in_a_large_batch():
    # A large batch (over CATEGORIZE_FROM words) hashes its words another way than a single question.
    from seeder.retrieve import wording

    rng = np.random.default_rng(3)
    words = np.array(["who", "directed", "films", "the", "of", "written", "by", "what", "genre", "year"])
    texts = [" ".join(rng.choice(words, 6)) + f" Title {i}" for i in range(wording.CATEGORIZE_FROM // 7 + 10)]
    names = [[f"Title {i}"] for i in range(len(texts))]
    batch = question_form(texts, names, 64)
    alone = np.concatenate([question_form([t], [n], 64) for t, n in zip(texts[:20], names[:20])])
    np.testing.assert_array_equal(batch[:20], alone)


def test_seed_names_follow_the_seed_rows():
    names = pa.array(["a", "b", "c", "d"])
    assert seed_names(names, np.array([[2, -1], [-1, -1], [0, 3]])) == [["c"], [], ["a", "d"]]


def test_the_prior_reads_which_relation_comes_first_from_the_wording():
    # "the B of the A of X" against "the A of the B of X": the same words, so an order-blind encoder
    # (here a constant query embedding) cannot tell them apart; the distance of each word to X can.
    rng = np.random.default_rng(0)
    base, n = 4, 600
    first_is_a = rng.random(n) < 0.5
    entities = [f"Entity {i}" for i in range(n)]
    texts = [
        f"what is the {'beta' if a else 'alpha'} of the {'alpha' if a else 'beta'} of {e}" for a, e in zip(first_is_a, entities)
    ]
    codes = np.where(first_is_a, (ROOT * base + 0) * base + 1, (ROOT * base + 1) * base + 0)
    embedding = np.ones((n, 8), np.float32) / np.sqrt(8)
    profile = np.ones((n, base), np.float32)
    wording = question_form(texts, [[e] for e in entities], 128)
    cfg = PriorConfig(epochs=40, hidden_dim=32, lr=1e-2, min_count=1)
    train, test = np.arange(n) < 450, np.arange(n) >= 450

    def accuracy(inputs, wording_dim):
        prior = train_prior(
            inputs[train],
            np.arange(450),
            codes[train],
            np.ones(450, np.float32),
            np.arange(450),
            base,
            cfg,
            echo=lambda _: None,
            wording_dim=wording_dim,
        )
        top = prior.vocab[prior.probs(inputs[test]).argmax(axis=1)]
        return float(np.mean(top == codes[test])), prior

    with_wording, prior = accuracy(prior_inputs(embedding, profile, wording), 128)
    without, _ = accuracy(prior_inputs(embedding, profile), 0)
    assert with_wording > 0.95
    assert without < 0.7
    # The prior computes its own wording block from the texts, and says so when they are missing.
    np.testing.assert_allclose(
        prior.probs(
            prior.inputs(
                embedding[test],
                profile[test],
                [texts[i] for i in np.flatnonzero(test)],
                [[entities[i]] for i in np.flatnonzero(test)],
            )
        ),
        prior.probs(prior_inputs(embedding, profile, wording)[test]),
        rtol=1e-5,
    )
    with pytest.raises(ConfigError, match="question texts"):
        prior.inputs(embedding, profile, None, None)


def test_the_wording_width_survives_save_and_load(tmp_path):
    prior = fixed_prior([ROOT * 2], 2, 10, wording_dim=6)
    prior.save(tmp_path)
    assert RelationPathPrior.load(tmp_path).wording_dim == 6


def test_three_relation_phrases_keep_distinct_distances():
    # r1, r2 and r3 of "the r3 of the r2 of the r1 of X" sit 2, 5 and 8 words before X.
    from seeder.retrieve.wording import distance_bucket

    buckets = distance_bucket(np.array([-8, -5, -2, 0, 2, 5, 8, 10, 30, -30]))
    assert len(set(buckets[:3].tolist())) == 3
    assert buckets.tolist()[3:] == [0, 2, 5, 6, 6, 7, -7]


def test_a_prior_trained_on_other_wording_features_is_refused(tmp_path):
    import json

    from seeder.system.io import DataError

    prior = fixed_prior([ROOT * 2], 2, 10, wording_dim=6)
    prior.save(tmp_path)
    meta = json.loads((tmp_path / "prior.json").read_text())
    (tmp_path / "prior.json").write_text(json.dumps({**meta, "wording_version": 0}))
    with pytest.raises(DataError, match="rerun preprocessing"):
        RelationPathPrior.load(tmp_path)
