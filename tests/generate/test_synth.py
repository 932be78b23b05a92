"""Synthetic relation-tracing graphs: answers exact by walking the stored CSR, splits, determinism, hubs, multi-answer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.compute as pc
import pytest

from seeder.cli.main import main
from seeder.config import ConfigError, field_docs
from seeder.data.store import open_dataset
from seeder.generate.synth import SynthConfig, load_synth_config, synthesize

SMALL = SynthConfig(
    nodes=500,
    relations=5,
    max_path_length=3,
    queries=400,
    hubs=3,
    hub_degree=60,
    multi_answer_frac=0.3,
    multi_answer_fanout=3,
    seed=7,
)


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "ds"
    synthesize(SMALL, out)
    return open_dataset(out)


def walk(kg, nodes: np.ndarray, relation: int) -> list[set[int]]:
    """Targets of out-edges with ``relation`` from each node, read from the stored CSR."""
    indptr, nbrs, rels = np.asarray(kg.indptr), np.asarray(kg.neighbors), np.asarray(kg.edge_relations)
    out = []
    for u in nodes:
        lo, hi = indptr[u], indptr[u + 1]
        out.append(set(nbrs[lo:hi][rels[lo:hi] == relation].tolist()))
    return out


def test_every_answer_is_the_composed_permutation_walked_on_stored_edges(kg):
    assert assert_answers_are_the_paths_walked(kg)["multi_answer"] > 0


def test_fanout_questions_answer_every_node_their_path_reaches(tmp_path):
    cfg = dataclasses.replace(SMALL, multi_answer_frac=0.1, fanout_frac=0.4)
    synthesize(cfg, tmp_path / "fan")
    fan = open_dataset(tmp_path / "fan")
    counts = assert_answers_are_the_paths_walked(fan)
    assert counts["fanout"] > 100 and counts["multi_answer"] > 10
    three = [q for q in fan.queries.to_pylist() if q["fanout"] and q["hop"] == 3]
    assert np.mean([len(q["answers"]) for q in three]) > 15  # up to 27 = 3^3 nodes
    assert all(q["text"].startswith("Which entities are the associate of the associate of the associate of ") for q in three)
    # Without fan-out, no column (and no extra random draws: see test_same_seed_same_bytes_other_seed_other_graph).
    assert "fanout" not in open_dataset(_synth(tmp_path / "plain", SMALL)).queries.column_names


def test_text_conditioned_questions_answer_the_associates_of_the_named_type(tmp_path):
    cfg = dataclasses.replace(SMALL, multi_answer_frac=0.1, condition_frac=0.4)
    conditioned = open_dataset(_synth(tmp_path / "cond", cfg))
    counts = assert_answers_are_the_paths_walked(conditioned)
    assert counts["conditioned"] > 100 and counts["multi_answer"] > 10
    rows = [q for q in conditioned.queries.to_pylist() if q["conditioned"]]
    # The type leaves out some associates: fewer answers than the path reaches, on average.
    assert np.mean([len(q["answers"]) for q in rows]) < 0.7 * SMALL.multi_answer_fanout
    assert all(q["text"].split()[2:5] == ["is", "the", "associate"] for q in rows)
    assert "conditioned" not in open_dataset(_synth(tmp_path / "plain", SMALL)).queries.column_names


def _synth(out, cfg):
    synthesize(cfg, out)
    return out


def assert_answers_are_the_paths_walked(kg) -> dict[str, int]:
    """Walks every query's relation path on the stored edges; its answers must be exactly the nodes
    reached (of the named type for a text-conditioned one). Returns how many queries were multi-answer,
    fan-out and text-conditioned ones."""
    queries = kg.queries.to_pylist()
    multi_rel = kg.relations.column("name").to_pylist().index("associate_of")
    node_type = kg.nodes.column("type").to_pylist()
    n_multi = n_fanout = n_conditioned = 0
    for q in queries:
        frontier = {q["start"]}
        for r in q["path"]:
            nxt = set()
            for targets in walk(kg, np.array(sorted(frontier)), r):
                nxt |= targets
            if r != multi_rel:
                assert len(nxt) == len(frontier) == 1, "a permutation relation maps one node to exactly one"
            frontier = nxt
        if q.get("conditioned", False):  # "Which film is ...": the reached nodes of that type
            wanted = q["text"].split()[1]
            frontier = {v for v in frontier if node_type[v] == wanted}
            assert frontier, "the type is drawn from the reached nodes, so one at least has it"
        assert sorted(frontier) == sorted(q["answers"]), q
        assert q["hop"] == len(q["path"])
        n_multi += q["multi_answer"]
        n_fanout += q.get("fanout", False)
        n_conditioned += q.get("conditioned", False)
    return {"multi_answer": n_multi, "fanout": n_fanout, "conditioned": n_conditioned}


def test_permutation_relations_are_bijections(kg):
    edges = kg.table("edges").to_pydict()
    src, dst, rel = (np.array(edges[c]) for c in ("src", "dst", "relation"))
    for r in range(SMALL.relations):
        assert np.array_equal(np.sort(src[rel == r]), np.arange(SMALL.nodes))
        assert np.array_equal(np.sort(dst[rel == r]), np.arange(SMALL.nodes))


def test_splits_are_disjoint_and_cover_all_queries(kg):
    ids = {s: set(kg.queries_of(s).column("id").to_pylist()) for s in ("train", "val", "test")}
    assert not (ids["train"] & ids["val"]) and not (ids["train"] & ids["test"]) and not (ids["val"] & ids["test"])
    assert sum(map(len, ids.values())) == kg.queries.num_rows == SMALL.queries
    assert all(len(v) > 0 for v in ids.values())


def test_hubs_have_many_neighbours_and_multi_answer_queries_have_several_answers(kg):
    deg = np.bincount(kg.table("edges").column("src").to_numpy(), minlength=kg.num_nodes)
    # Non-hub out-degree: one edge per permutation relation plus <= fanout associates.
    assert (deg >= SMALL.hub_degree).sum() == SMALL.hubs
    assert np.sort(deg)[-SMALL.hubs - 1] <= SMALL.relations + SMALL.multi_answer_fanout
    q = kg.queries
    n_answers = pc.list_value_length(q.column("answers")).to_numpy()
    multi = q.column("multi_answer").to_numpy(zero_copy_only=False)
    assert (n_answers[~multi] == 1).all()
    assert (n_answers[multi] >= 2).mean() > 0.9 and n_answers[multi].max() <= SMALL.multi_answer_fanout
    assert 0.2 < multi.mean() < 0.4


def test_same_seed_same_bytes_other_seed_other_graph(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    small = dataclasses.replace(SMALL, nodes=300, queries=100)
    synthesize(small, a)
    synthesize(small, b)
    synthesize(dataclasses.replace(small, seed=8), c)
    for name in ("nodes", "relations", "edges", "queries"):
        assert (a / f"{name}.parquet").read_bytes() == (b / f"{name}.parquet").read_bytes()
    assert (a / "edges.parquet").read_bytes() != (c / "edges.parquet").read_bytes()


def test_names_unique_and_question_names_start_but_not_answer(kg):
    names = kg.nodes.column("name").to_pylist()
    assert len(set(names)) == len(names)
    for q in kg.queries.slice(0, 100).to_pylist():
        assert names[q["start"]] in q["text"]
        for a in q["answers"]:
            if a != q["start"]:
                assert names[a] not in q["text"]


def test_cli_flags_override_yaml_and_unknown_keys_fail(tmp_path):
    cfg_file = tmp_path / "s.yaml"
    cfg_file.write_text("synth:\n  nodes: 50\n  queries: 20\n  hubs: 1\n  hub_degree: 5\n")
    assert load_synth_config(cfg_file, {"queries": 30}).queries == 30
    assert load_synth_config(cfg_file, {}).nodes == 50
    cfg_file.write_text("synth:\n  nodez: 50\n")
    with pytest.raises(ConfigError, match="unknown key synth.nodez"):
        load_synth_config(cfg_file, {})
    out = tmp_path / "ds"
    assert main(["synth", "--out", str(out), "--nodes", "80", "--queries", "40", "--hubs", "1", "--hub-degree", "10"]) == 0
    assert open_dataset(out).num_nodes == 80
    assert main(["synth", "--out", str(out), "--nodes", "80"]) == 2  # exists without --overwrite
    assert main(["synth", "--out", str(tmp_path / "bad"), "--nodes", "1"]) == 2


def test_every_synth_field_is_documented():
    docs = field_docs(SynthConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(SynthConfig)}


def test_repo_default_yaml_matches_the_dataclass_defaults():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "synth_default.yaml"
    assert load_synth_config(path, {}) == SynthConfig()


def test_synth_overwrite_replaces_its_own_output_only_and_waits_for_no_one(tmp_path, capsys):
    from tests.processes import lock_held_by_another_process

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    assert main(["synth", "--out", str(folder), "--nodes", "80", "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"seeder synth: error: {folder}: not a directory this tool wrote") and "\n" not in err
    assert [p.name for p in folder.iterdir()] == ["keep.txt"] and (folder / "keep.txt").read_text() == "mine"
    out = tmp_path / "ds"
    assert main(["synth", "--out", str(out), "--nodes", "80", "--queries", "40", "--hubs", "1", "--hub-degree", "10"]) == 0
    with lock_held_by_another_process(out) as other:
        assert main(["synth", "--out", str(out), "--nodes", "90", "--overwrite"]) == 2
        assert f"is being written by process {other.pid}" in capsys.readouterr().err
    assert (
        main(["synth", "--out", str(out), "--nodes", "90", "--queries", "40", "--hubs", "1", "--hub-degree", "10", "--overwrite"])
        == 0
    )
    assert open_dataset(out).num_nodes == 90
