"""seeder.generate.reworded: a labelled question lends its words to other nodes of its topic's type, whose
answers are exactly its path's ends from them (brute force); rewordings train, never over a held-out path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from seeder.config import QuestionsConfig, SynthConfig
from seeder.data.store import open_dataset
from seeder.generate.questions import build_dataset
from seeder.generate.reworded import MIN_F1, reworded
from seeder.generate.synth import synthesize
from seeder.retrieve.seeds import normalise_texts
from tests.generate.test_questions import brute_force_ends


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("rw") / "source"
    synthesize(SynthConfig(nodes=300, relations=4, max_path_length=2, queries=200, hubs=2, hub_degree=40, seed=3), out)
    return open_dataset(out)


def f1(found: set[int], answers: set[int]) -> float:
    return 2 * len(found & answers) / max(len(found) + len(answers), 1)


def test_a_rewording_asks_the_labelled_question_of_another_node_of_the_same_type(source):
    labelled = source.queries.filter(pc.equal(source.queries["split"], "train")).slice(0, 40)
    made = reworded(source, labelled, QuestionsConfig(rewordings=3, max_answers=30), np.random.default_rng(0))
    assert len(made["anchors"]) >= 60  # most of the 40 lend three
    assert np.bincount(made["source"], minlength=40).max() == 3
    nodes = source.nodes.to_pylist()
    rows = labelled.to_pylist()
    answers = np.split(made["answers"], made["answer_ptr"][1:-1])
    for i, anchor in enumerate(made["anchors"].tolist()):
        question = rows[made["source"][i]]
        topic = question["start"]  # the synthetic generator's own topic entity
        assert anchor != topic and nodes[anchor]["type"] == nodes[topic]["type"]
        original = normalise_texts([question["text"]]).to_pylist()[0]
        topic_name = normalise_texts([nodes[topic]["name"]]).to_pylist()[0]
        assert made["texts"][i] == f" {original} ".replace(f" {topic_name} ", f" {nodes[anchor]['name']} ").strip()
        path = made["paths"][i][: made["lengths"][i]].tolist()
        assert sorted(brute_force_ends(source, anchor, path)) == answers[i].tolist()
        assert 1 <= len(answers[i]) <= 30
        # The path explains the labelled question's own answers from its topic.
        assert f1(brute_force_ends(source, topic, path), set(question["answers"])) >= MIN_F1


def test_a_question_that_names_no_node_lends_nothing(source):
    labelled = source.queries.filter(pc.equal(source.queries["split"], "train")).slice(0, 5)
    nameless = labelled.set_column(1, "text", pa.array(["what is the rival of the thing"] * 5))
    made = reworded(source, nameless, QuestionsConfig(rewordings=3), np.random.default_rng(0))
    assert len(made["anchors"]) == 0 and made["answer_ptr"].tolist() == [0]


def test_rewordings_train_beside_the_generated_questions_never_over_a_held_out_path(source, tmp_path):
    cfg = QuestionsConfig(count=400, real_train=30, rewordings=4, holdout_fraction=0.3, seed=2)
    info = build_dataset(source.path, tmp_path / "few", cfg, echo=lambda _: None)
    made = open_dataset(tmp_path / "few")
    held = set(made.manifest["source"]["held_out_paths"])
    rows = made.queries.to_pylist()
    kept = [q for q in rows if not q["generated"] and q["split"] == "train"]
    assert len(kept) == 30
    by_id = {q["id"]: q for q in source.queries.to_pylist()}
    names = source.nodes.column("name").to_pylist()

    def form(text: str, name: str) -> str:
        return f" {text} ".replace(f" {name} ", " @ ").strip()

    kept_forms = set()
    for q in kept:
        topic_name = normalise_texts([names[by_id[q["id"]]["start"]]]).to_pylist()[0]
        kept_forms.add(form(normalise_texts([q["text"]]).to_pylist()[0], topic_name))
    generated = [q for q in rows if q["generated"]]
    reworded_rows = generated[-info["rewordings"] :]
    assert 30 <= info["rewordings"] <= 4 * 30
    num_ids = 2 * source.num_relations
    for q in reworded_rows:
        code = 1
        for r in q["relation_path"]:
            code = code * num_ids + r
        assert q["split"] == "train" and code not in held
        assert sorted(brute_force_ends(source, q["anchor_id"], q["relation_path"])) == q["answers"]
        assert form(q["text"], names[q["anchor_id"]]) in kept_forms  # a labelled question's words, not a template's
    cfg_none = QuestionsConfig(count=400, real_train=30, rewordings=0, holdout_fraction=0.3, seed=2)
    assert build_dataset(source.path, tmp_path / "none", cfg_none, echo=lambda _: None)["rewordings"] == 0
