"""seeder.generate.questions: generated questions' answers are exactly their paths' ends (brute force on the stored
edges), held-out relation paths never train, the source's own val and test questions stay, a paraphraser
plugs in."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from seeder.config import ConfigError, QuestionsConfig, SynthConfig
from seeder.data.store import open_dataset
from seeder.generate.questions import build_dataset, generate
from seeder.generate.synth import synthesize
from seeder.system.io import DataError


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "source"
    synthesize(SynthConfig(nodes=300, relations=4, max_path_length=2, queries=200, hubs=2, hub_degree=40, seed=3), out)
    return open_dataset(out)


def brute_force_ends(kg, anchor: int, path: list[int]) -> set[int]:
    """The nodes ``path`` (CSR relation ids: r forwards, r + R backwards) reaches from ``anchor``."""
    edges = kg.table("edges").to_pydict()
    num_r = kg.num_relations
    step: dict[tuple[int, int], set[int]] = {}
    for s, d, r in zip(edges["src"], edges["dst"], edges["relation"]):
        step.setdefault((s, r), set()).add(d)
        step.setdefault((d, r + num_r), set()).add(s)
    frontier = {anchor}
    for r in path:
        frontier = set().union(*(step.get((u, r), set()) for u in frontier))
    return frontier - {anchor}


def test_answers_are_exactly_the_ends_of_each_question_path(source, tmp_path):
    build_dataset(source.path, tmp_path / "gen", QuestionsConfig(count=600, max_answers=30, seed=1), echo=lambda _: None)
    made = open_dataset(tmp_path / "gen")
    generated = [q for q in made.queries.to_pylist() if q["generated"]]
    assert len(generated) > 300
    assert {q["hop"] for q in generated} == {1, 2, 3}
    for q in generated:
        ends = brute_force_ends(source, q["anchor_id"], q["relation_path"])
        assert sorted(ends) == q["answers"], q
        assert 1 <= len(q["answers"]) <= 30 and q["hop"] == len(q["relation_path"])


def test_held_out_paths_never_train_and_the_source_keeps_its_val_and_test(source, tmp_path):
    cfg = QuestionsConfig(count=800, holdout_fraction=0.3, seed=2)
    build_dataset(source.path, tmp_path / "gen", cfg, echo=lambda _: None)
    made = open_dataset(tmp_path / "gen")
    held = set(made.manifest["source"]["held_out_paths"])
    assert held
    num_ids = 2 * source.num_relations
    rows = made.queries.to_pylist()
    for q in rows:
        if q["generated"]:
            code = 1
            for r in q["relation_path"]:
                code = code * num_ids + r
            assert code not in held and q["split"] == "train"
    real = {q["id"]: q for q in source.queries.to_pylist()}
    kept = [q for q in rows if not q["generated"]]
    assert {q["id"] for q in kept} == {i for i, q in real.items() if q["split"] != "train"}  # real_train=0
    assert all(q["answers"] == real[q["id"]]["answers"] and q["split"] == real[q["id"]]["split"] for q in kept)
    # A few real training questions for few-label runs: a fixed sample.
    build_dataset(source.path, tmp_path / "few", QuestionsConfig(count=800, real_train=10, seed=2), echo=lambda _: None)
    few = open_dataset(tmp_path / "few").queries.to_pylist()
    real_train = {q["id"] for q in few if not q["generated"] and q["split"] == "train"}
    assert len(real_train) == 10
    # Not the ids seeder.preprocessing.derive's sample favours (the smallest hashes): that sample would hold every one.
    train_ids = np.array(sorted(i for i, q in real.items() if q["split"] == "train"), dtype=np.uint64)
    smallest = set(train_ids[np.argsort((train_ids * np.uint64(2654435761)) % np.uint64(2**32), kind="stable")[:10]].tolist())
    assert real_train != smallest


def test_without_val_questions_the_held_out_paths_become_val(source, tmp_path):
    import pyarrow as pa
    import pyarrow.compute as pc

    from seeder.data.store import write_dataset

    bare = source.queries.filter(pc.equal(source.queries.column("split"), "test"))
    write_dataset(tmp_path / "bare", source.nodes, source.relations, source.table("edges"), bare)
    build_dataset(
        tmp_path / "bare", tmp_path / "gen", QuestionsConfig(count=800, holdout_fraction=0.3, seed=2), echo=lambda _: None
    )
    made = open_dataset(tmp_path / "gen").queries
    val = made.filter(pc.equal(made.column("split"), "val")).to_pylist()
    assert val and all(q["generated"] and q["hop"] >= 2 for q in val)
    assert pa.types.is_boolean(made.schema.field("generated").type)


def test_without_the_source_val_questions_the_held_out_paths_validate_and_the_test_questions_stay(source, tmp_path):
    import pyarrow.compute as pc

    from seeder.cli.main import main

    held_out = tmp_path / "gen"
    # The command line's way, as a user runs it.
    assert main(["questions", "--dataset", str(source.path), "--out", str(held_out), "--count", "800",
                 "--holdout-fraction", "0.3", "--seed", "2", "--source-val", "false"]) == 0  # fmt: skip
    made = open_dataset(held_out).queries.to_pylist()
    real = {q["id"]: q for q in source.queries.to_pylist()}
    assert {q["id"] for q in made if not q["generated"]} == {i for i, q in real.items() if q["split"] == "test"}
    val = [q for q in made if q["split"] == "val"]
    assert val and all(q["generated"] and q["hop"] >= 2 for q in val)
    # Generating is unchanged: the training questions are those of a run that keeps the source's val.
    build_dataset(source.path, tmp_path / "kept", QuestionsConfig(count=800, holdout_fraction=0.3, seed=2), echo=lambda _: None)
    kept = open_dataset(tmp_path / "kept").queries
    train = kept.filter(pc.equal(kept.column("split"), "train")).column("text").to_pylist()
    assert [q["text"] for q in made if q["split"] == "train"] == train
    with pytest.raises(SystemExit):
        main(["questions", "--dataset", str(source.path), "--out", str(tmp_path / "x"), "--source-val", "maybe"])


def test_same_seed_same_questions_and_a_paraphraser_rewrites_them(source, monkeypatch):
    cfg = QuestionsConfig(count=300, seed=5)
    a, b = generate(source, cfg), generate(source, cfg)
    assert a["texts"] == b["texts"] and np.array_equal(a["answers"], b["answers"])
    module = types.ModuleType("my_paraphraser")
    module.shout = lambda texts: [t.upper() for t in texts]
    module.broken = lambda texts: texts[:-1]
    monkeypatch.setitem(sys.modules, "my_paraphraser", module)
    from seeder.generate.questions import load_paraphraser

    assert generate(source, cfg, load_paraphraser("my_paraphraser:shout"))["texts"] == [t.upper() for t in a["texts"]]
    with pytest.raises(DataError, match="one non-empty string per question"):
        generate(source, cfg, load_paraphraser("my_paraphraser:broken"))
    with pytest.raises(ConfigError, match="module:function"):
        load_paraphraser("no_colon")


def test_each_question_records_its_phrasing_and_real_ones_none(source, tmp_path):
    from seeder.generate.questions import TEMPLATES

    build_dataset(source.path, tmp_path / "gen", QuestionsConfig(count=600, seed=1), echo=lambda _: None)
    rows = open_dataset(tmp_path / "gen").queries.to_pylist()
    generated = [q for q in rows if q["generated"]]
    assert {q["phrasing"] for q in generated} == set(range(len(TEMPLATES)))
    assert all(q["phrasing"] == -1 for q in rows if not q["generated"])
    # The recorded phrasing is the template the text was written with: its fixed words are in the text.
    for q in generated:
        fixed = [w for w in re.split(r"\{\w+\}", TEMPLATES[q["phrasing"]]) if w.strip(" ?:,")]
        assert all(w.strip(" ?") in q["text"] for w in fixed), (q["text"], TEMPLATES[q["phrasing"]])


def test_texts_come_from_the_graphs_relation_texts_and_node_types(source):
    made = generate(source, QuestionsConfig(count=200, seed=4))
    relation_texts = source.relation_texts
    half = len(relation_texts) // 2
    types = set(source.table("nodes", ["type"]).column("type").to_pylist())
    backward = typed = 0
    for text, path, n in zip(made["texts"], made["paths"], made["lengths"]):
        # Each relation is read from the anchor (its text) or from the answer (its inverse text), except a
        # pair asked by what it shares ("the ship that shares a city with X").
        forward = all(relation_texts[r] in text for r in path[:n])
        read = [relation_texts[r] in text or relation_texts[(r + half) % len(relation_texts)] in text for r in path[:n]]
        in_shared_pair = [any(goes_back(path, h, half) for h in (i, i + 1) if 0 < h < n) for i in range(n)]
        assert all(r or (s and SHARE_WORDS.search(text)) for r, s in zip(read, in_shared_pair)), text
        backward += not forward
        # Some phrasings name the nodes on the way by their type ("the movie starring X").
        typed += n > 1 and any(f"the {t} " in text for t in types)
    assert backward > 0 and typed > 0


SHARE_WORDS = re.compile(r"whose \w+ also |that shares a |the same \w+ as ")


def goes_back(path, hop: int, num_relations: int) -> bool:
    """Whether ``hop`` follows the previous hop's relation backwards (r then r + R, or the reverse)."""
    return hop > 0 and path[hop] == (path[hop - 1] + num_relations) % (2 * num_relations)


def test_a_hop_back_along_the_previous_relation_may_be_asked_by_what_the_two_nodes_share(source):
    """X -r-> m -r^-1-> Y: "the ship that shares a city with X", "the ship whose city also ... X"."""
    made = generate(source, QuestionsConfig(count=2000, seed=6))
    shared = [(t, p[:n]) for t, p, n in zip(made["texts"], made["paths"], made["lengths"]) if SHARE_WORDS.search(t)]
    assert len(shared) > 5
    assert all(any(goes_back(path, h, source.num_relations) for h in range(1, len(path))) for _, path in shared), shared


def test_questions_for_an_imported_graph_keep_its_triples_provenance(tmp_path):
    """An importer records where each triple came from; the generated dataset has the same graph, so its
    triples still point at the source's file and lines, read by the source's version."""
    from seeder.data.importers.triples import import_triples
    from seeder.data.provenance import EdgeIndex

    rng = np.random.default_rng(0)
    rows = sorted({(f"n{h}", f"r{r}", f"n{t}") for h, r, t in rng.integers(0, [60, 3, 60], size=(400, 3)) if h != t})
    kb = tmp_path / "kb.tsv"
    kb.write_text("head\trelation\ttail\n" + "".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))
    import_triples(kb, tmp_path / "ds")
    source = open_dataset(tmp_path / "ds")
    build_dataset(source.path, tmp_path / "gen", QuestionsConfig(count=100, seed=0), echo=lambda _: None)
    gen = open_dataset(tmp_path / "gen")
    edges = gen.table("edges", ["src", "dst", "relation"])
    found = EdgeIndex(gen).sources(*(edges.column(c).to_numpy() for c in ("src", "relation", "dst")))
    lines = kb.read_text().splitlines()
    names = gen.node_names.to_pylist()
    relation_names = gen.relations.column("name").to_pylist()
    for s, r, d, where in zip(*(edges.column(c).to_pylist() for c in ("src", "relation", "dst")), found):
        assert where["dataset"] == source.fingerprint and where["file"] == "kb.tsv"
        assert lines[where["line"] - 1].split("\t") == [names[s], relation_names[r], names[d]]
