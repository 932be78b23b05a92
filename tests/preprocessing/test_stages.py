"""Stage work without Ray: a committed stage records its files, a rerun verifies them, a damaged stage
goes back to a working directory that keeps its intact shards; embedding rows placed by id; the
seeds stage's ANN pilot; and the summary's subgraph ceilings."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from seeder.data.subgraphs import SUBGRAPH_SCHEMA, SubgraphSet
from seeder.preprocessing.stages import RowPlacer, StageDir, ceilings, subgraph_shard_path, write_table_atomic
from seeder.retrieve.metrics import subgraph_ceiling
from seeder.system.io import DataError, read_manifest


def _committed(tmp_path, shards: int = 4) -> StageDir:
    stage = StageDir(tmp_path, "subgraphs", "fp1")
    work = stage.open({"query_block": 10})
    for block in range(shards):
        write_table_atomic(pa.table({"query_id": np.arange(block * 10, block * 10 + 10)}), subgraph_shard_path(work, block))
    stage.commit({"seconds": 1.0, "info": {}})
    return stage


def test_commit_records_every_shard_and_the_layout(tmp_path):
    stage = _committed(tmp_path)
    manifest = read_manifest(stage.target)
    assert sorted(manifest["files"]) == [f"part-{b:06d}.parquet" for b in range(4)]
    assert all(entry["rows"] == 10 and entry["bytes"] > 0 for entry in manifest["files"].values())
    assert manifest["layout"] == {"query_block": 10} and manifest["record_seconds"] >= 0
    assert stage.reusable(echo=lambda line: None) == manifest


def test_a_damaged_stage_is_reported_and_reopened_with_its_intact_shards(tmp_path):
    stage = _committed(tmp_path)
    size = read_manifest(stage.target)["files"]["part-000001.parquet"]["bytes"]
    subgraph_shard_path(stage.target, 2).unlink()
    with open(subgraph_shard_path(stage.target, 1), "r+b") as fh:
        fh.truncate(50)
    lines = []
    assert stage.reusable(echo=lines.append) is None
    assert lines == [
        f"subgraphs: subgraphs/part-000001.parquet: size 50 != recorded {size} bytes",
        "subgraphs: subgraphs/part-000002.parquet: missing",
        "subgraphs: outputs do not match its manifest; recomputing subgraphs and the stages after it",
    ]
    assert not stage.target.exists()
    # The working directory keeps the two intact shards under the stage's key, so open() reuses them.
    assert sorted(p.name for p in stage.partial.glob("part-*")) == ["part-000000.parquet", "part-000003.parquet"]
    assert stage.open({"query_block": 10}) == stage.partial
    assert len(list(stage.partial.glob("part-*"))) == 2
    assert json.loads((stage.partial / "partial.json").read_text()) == {"fingerprint": "fp1", "layout": {"query_block": 10}}


def test_a_stage_without_file_records_is_recomputed(tmp_path):
    from seeder.system.io import write_manifest

    stage = _committed(tmp_path)
    manifest = read_manifest(stage.target)
    del manifest["files"]
    write_manifest(stage.target, manifest)
    lines = []
    assert stage.reusable(echo=lines.append) is None
    assert lines[0] == "subgraphs: subgraphs/manifest.json: records no files (written before seeder verified its outputs)"


def test_the_ann_pilot_measures_recall_on_a_sample_of_the_nodes(monkeypatch):
    """The pilot that decides whether ``seed.search: auto`` builds the full index: perfect on tight
    clusters whose queries sit next to a node, well short of it on structureless features."""
    from seeder.config import SeedConfig
    from seeder.preprocessing import stages as preprocess

    monkeypatch.setattr(preprocess, "ANN_PILOT_NODES", 3_000)
    rng = np.random.default_rng(0)
    cfg = SeedConfig(ann_nlist=30, ann_nprobe=2, ann_train_sample=3_000)

    def unit(x):
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    centres = unit(rng.standard_normal((30, 32)))
    nodes = unit(centres[rng.integers(0, 30, 6_000)] + 0.05 * rng.standard_normal((6_000, 32)))
    queries = unit(nodes[rng.integers(0, 6_000, 200)] + 0.01 * rng.standard_normal((200, 32)))
    clustered = preprocess.ann_pilot(queries, nodes, cfg)
    assert clustered["nodes"] == 3_000 and clustered["sample_queries"] == 200 and clustered["recall"] > 0.97

    flat = preprocess.ann_pilot(unit(rng.standard_normal((200, 32))), unit(rng.standard_normal((6_000, 32))), cfg)
    assert flat["recall"] < 0.6


def test_embedding_rows_are_placed_by_id_whatever_order_the_shards_come_in():
    placer = RowPlacer(np.arange(0, 60, 3), "embed/nodes")  # ids 0, 3, ..., 57
    np.testing.assert_array_equal(placer.positions(np.array([30, 33, 36]), "part-2"), [10, 11, 12])
    np.testing.assert_array_equal(placer.positions(np.array([0, 57]), "part-0"), [0, 19])
    with pytest.raises(DataError, match="part-1: embedded ids do not match.*rerun the embed stage"):
        placer.positions(np.array([3, 33]), "part-1")  # 33 came already
    with pytest.raises(DataError, match="part-3: embedded ids do not match"):
        placer.positions(np.array([4]), "part-3")  # not an id of the dataset
    with pytest.raises(DataError, match=r"embed/nodes: 15 ids have no embedding \(first \[3, 6, 9\]\)"):
        placer.check_complete()


class _Questions:
    """The one thing ``ceilings`` asks of a graph: its questions' attributes, by id."""

    def query_attributes(self, query_ids: np.ndarray) -> dict[str, np.ndarray]:
        return {"hop": (np.asarray(query_ids) % 3 + 1).astype(object)}


def test_ceilings_are_the_per_split_ceilings_whatever_the_order_of_the_rows():
    rng = np.random.default_rng(0)
    rows = []
    for q in range(60):
        size, answers = int(rng.integers(1, 6)), rng.choice(40, size=int(rng.integers(1, 4)), replace=False)
        nodes = rng.choice(40, size=size, replace=False)
        rows.append(
            {
                "query_id": q,
                "split": ["train", "val", "test"][q % 4 % 3],
                "nodes": nodes.tolist(),
                "hop": [0] * size,
                "score": rng.random(size).tolist(),
                "is_answer": np.isin(nodes, answers).tolist(),
                "path_end": [0.0] * size,
                "edge_src": [],
                "edge_dst": [],
                "edge_rel": [],
                "answers": answers.tolist(),
            }
        )
    ordered = SubgraphSet.from_arrow(pa.Table.from_pylist(rows, schema=SUBGRAPH_SCHEMA))
    shuffled = ordered.take(rng.permutation(len(ordered)))
    expected = {
        split: subgraph_ceiling(part, {"hop": _Questions().query_attributes(part.query_ids)["hop"]})
        for split, part in [("all", ordered)] + [(s, ordered.select_split(s)) for s in ("test", "train", "val")]
    }
    assert ceilings(ordered, _Questions()) == expected
    assert ceilings(shuffled, _Questions()) == expected
    assert 0 < expected["all"]["all"]["hit_any"] < 1 and expected["val"]["all"]["queries"] == 15


def test_the_prior_stage_lets_the_labelled_training_questions_vote(tmp_path):
    """``prior.vote: labelled``: the questions not marked generated keep their readings and target paths
    beside the prior (``vote.npz``), and the prior loaded from there applies their vote."""
    from seeder.config import SeederConfig, SynthConfig
    from seeder.data.store import open_dataset, write_dataset
    from seeder.generate.synth import generate
    from seeder.preprocessing.artifacts import read_seed_table
    from seeder.preprocessing.stages import generated_mask, train_query_ids
    from seeder.retrieve.prior import RelationPathPrior, prior_inputs, seed_relation_profile
    from tests.preprocessing.test_incremental import config_for, full_run

    nodes, relations, edges, queries = generate(
        SynthConfig(nodes=300, relations=4, max_path_length=2, queries=400, hubs=0, multi_answer_frac=0.0, seed=3)
    )
    train = np.asarray(queries.column("split").to_pylist()) == "train"
    generated = train & (np.cumsum(train) > 20)  # the first 20 training questions are labelled
    dataset = write_dataset(tmp_path / "mixed", nodes, relations, edges, queries.append_column("generated", pa.array(generated)))
    kg = open_dataset(dataset)
    config = config_for(
        "entity", learned=True, extra=("prior.vote=labelled", "seed.k0=1", "prior.min_count=1", "prior.wording_dim=0")
    )
    out = full_run(dataset, tmp_path / "art", config)
    prior = RelationPathPrior.load(out / "prior")
    ids = train_query_ids(kg)
    labelled = ids[~generated_mask(kg, ids)]
    assert len(labelled) == 20 and prior.vote is not None and 0 < prior.vote.size <= 20
    assert json.loads((out / "prior" / "prior.json").read_text())["vote_questions"] == prior.vote.size
    # Each voter's reading is its question's query features (prior.question: text), normalised.
    features = np.load(out / "features" / "query.npy")[np.searchsorted(np.load(out / "features" / "query_ids.npy"), labelled)]
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    assert np.isclose(prior.vote.features @ unit.T, 1, atol=1e-5).any(axis=1).all()
    # A labelled question asked again is answered with one of its own target paths.
    seed_ids, seeds, _ = read_seed_table(out / "seeds" / "seeds.parquet")
    profile = seed_relation_profile(
        kg.indptr, kg.edge_relations, seeds[np.searchsorted(seed_ids, labelled)], 2 * kg.num_relations
    )
    top = prior.probs(prior_inputs(features, profile)).argmax(axis=1)
    voter = np.flatnonzero(np.isclose(unit @ prior.vote.features.T, 1, atol=1e-5).any(axis=1))
    own = [set(prior.vote.slot[prior.vote.ptr[j] : prior.vote.ptr[j + 1]].tolist()) for j in range(prior.vote.size)]
    owner = np.isclose(unit[voter] @ prior.vote.features.T, 1, atol=1e-5).argmax(axis=1)
    assert all(top[v] in own[j] for v, j in zip(voter, owner))
    assert SeederConfig().prior.vote == "off"  # a config file's default: only derivation turns it on


def test_the_labelled_weight_is_part_of_the_prior_stage_fingerprint():
    from seeder.config import ConfigError, load_config
    from seeder.preprocessing.stages import check_config, stage_fingerprints

    learned = ["expand.relation_score=learned", "expand.hops=2", "prior.vote=off"]
    plain = stage_fingerprints(load_config(None, learned), "d")
    heavier = stage_fingerprints(load_config(None, [*learned, "prior.labelled_weight=20"]), "d")
    assert plain["paths"] == heavier["paths"] and plain["prior"] != heavier["prior"]
    assert plain["subgraphs"] != heavier["subgraphs"]  # the subgraphs follow the prior
    with pytest.raises(ConfigError, match="prior.labelled_weight must be positive"):
        check_config(load_config(None, ["prior.labelled_weight=0"]))


def test_the_path_text_switch_changes_only_a_masked_priors_fingerprint():
    from seeder.config import load_config
    from seeder.preprocessing.stages import stage_fingerprints

    learned = ["expand.relation_score=learned", "expand.hops=2", "prior.vote=off"]
    for question, differs in (("masked", True), ("text", False)):
        on = stage_fingerprints(load_config(None, [*learned, f"prior.question={question}"]), "d")
        off = stage_fingerprints(load_config(None, [*learned, f"prior.question={question}", "prior.path_text=false"]), "d")
        assert (on["prior"] != off["prior"]) is differs, question


def test_the_prior_stage_holds_out_a_whole_phrasing_of_the_generated_questions(tmp_path):
    """The text-match weights are chosen on the prior's held-out questions: for generated ones, every
    question of one phrasing (``held_out_targets``); a dataset without phrasings reads as all real."""
    from seeder.config import SeederConfig, SynthConfig
    from seeder.data.store import open_dataset, write_dataset
    from seeder.generate.synth import generate
    from seeder.preprocessing.stages import held_out_targets, question_phrasings, train_query_ids
    from seeder.retrieve.prior import RelationPathPrior

    nodes, relations, edges, queries = generate(SynthConfig(nodes=200, relations=3, queries=300, seed=4))
    train = np.asarray(queries.column("split").to_pylist()) == "train"
    phrasing = np.where(train & (np.arange(len(train)) >= 30), np.arange(len(train)) % 5, -1)  # 30 real, 5 phrasings
    plain = open_dataset(write_dataset(tmp_path / "plain", nodes, relations, edges, queries))
    marked = open_dataset(
        write_dataset(tmp_path / "marked", nodes, relations, edges, queries.append_column("phrasing", pa.array(phrasing)))
    )
    ids = train_query_ids(marked)
    assert (question_phrasings(plain, ids) == -1).all()
    read = question_phrasings(marked, ids)
    assert np.array_equal(read, phrasing[np.searchsorted(queries.column("id").to_numpy(), ids)])
    rows = np.repeat(np.arange(len(ids)), 2)  # two target paths per question
    codes = np.tile(np.array([5, 7]), len(ids))
    prior = RelationPathPrior(
        vocab=np.array([5, 7]),
        w1=np.zeros((1, 1), np.float32),
        b1=np.zeros(1, np.float32),
        w2=np.zeros((1, 2), np.float32),
        b2=np.zeros(2, np.float32),
        num_relation_ids=6,
        info={},
    )
    inputs = np.arange(len(ids), dtype=np.float32)[:, None]
    x, keys = held_out_targets(prior, inputs, rows, codes, ids, read, SeederConfig())
    held = x[:, 0].astype(int)
    assert len(set(read[held][read[held] >= 0].tolist())) == 1  # one phrasing of the five
    assert (read[held] >= 0).sum() == (read == read[held][read[held] >= 0][0]).sum()  # all of its questions
    assert len(keys) == 2 * len(held)
