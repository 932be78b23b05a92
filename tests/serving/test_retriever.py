"""seeder/serving/retriever.py: a trained model answering new questions, the same rankings as preprocessing and
``seeder evaluate``, triples and prompts, the pyfunc model, and the `seeder retrieve` batch command.

The session fixture ``trained`` (tests/conftest.py) builds a small synthetic graph, preprocesses it
(hash encoder, entity linking) and trains a model for a few epochs; every test reads it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ENV
from tests.conftest import run as _run
from tests.datasets import hand_built_artifacts, preprocess_by_hand


@pytest.fixture(scope="module")
def retriever(trained):
    from seeder import Retriever

    return Retriever.load(trained[0] / "run" / "model")


@pytest.mark.e2e
@pytest.mark.slow
def test_new_questions_rank_exactly_as_their_preprocessed_copies(retriever):
    """Encoding, seeding and K-HOP-WITH-FILTERING online give the preprocessed subgraphs, so the
    rankings of a question's text equal those of ``seeder evaluate`` on the same question."""
    from seeder.evaluation.evaluate import run_evaluation
    from seeder.retrieve.metrics import per_query_metrics

    result, subgraphs = retriever.rank_split("val")
    queries = retriever.artifacts.dataset.queries_of("val")
    text_of = dict(zip(queries.column("id").to_pylist(), queries.column("text").to_pylist()))
    texts = [text_of[q] for q in subgraphs.query_ids.tolist()]
    online, online_subgraphs = None, None
    online_subgraphs, features = retriever.subgraphs(texts)
    np.testing.assert_array_equal(online_subgraphs.nodes, subgraphs.nodes)
    np.testing.assert_array_equal(online_subgraphs.edge_src, subgraphs.edge_src)
    online, _, _ = retriever.rank(online_subgraphs, features)
    np.testing.assert_array_equal(online.ranking, result.ranking)
    hits = retriever.retrieve(texts, k=7)
    assert [[n.id for n in h.nodes] for h in hits] == [row[row >= 0][:7].tolist() for row in result.ranking]
    report = run_evaluation(
        retriever.artifacts,
        ["seeder"],
        "val",
        retriever.config,
        model=str(Path(retriever.artifacts.path).parent / "run" / "model"),
        log=lambda *a, **k: None,
    )
    mine = per_query_metrics(result, subgraphs.answer_ptr, subgraphs.answers, retriever.config.eval.ks)
    assert report["methods"]["seeder"]["all"]["hit_at_1"] == pytest.approx(float(mine["hit_at_1"].mean()))


@pytest.mark.e2e
def test_encoder_precision_is_checked_and_resolved(trained, retriever):
    """New questions are encoded as the artifacts were by default; ``auto`` picks bfloat16 only for a
    plain-torch transformer on a CPU with native bfloat16, so the hashing encoder here stays as it was."""
    from seeder import Retriever
    from seeder.system.io import DataError

    assert retriever.encoder_precision == "artifacts" and retriever.query_precision == "float32"
    assert Retriever.load(trained[0] / "run" / "model", encoder_precision="auto").query_precision == "float32"
    forced = Retriever.load(trained[0] / "run" / "model", encoder_precision="bfloat16")
    assert forced.query_precision == "bfloat16"
    # On a GPU the encoder runs in its own format whatever the CPU choice (no GPU here: the device is
    # only named, never used).
    from dataclasses import replace as dc_replace

    forced.device = "cuda:0"
    assert forced.on_gpu and forced.query_precision == "float16"
    forced.config = dc_replace(forced.config, embed=dc_replace(forced.config.embed, half_precision=False))
    assert forced.query_precision == "float32"
    from seeder.config import EmbedConfig
    from seeder.features import bert
    from seeder.serving.retriever import resolve_encoder_precision

    native = "bfloat16" if bert.native_bfloat16() else "float32"
    assert resolve_encoder_precision("auto", EmbedConfig(encoder="minilm")) == native
    assert resolve_encoder_precision("auto", EmbedConfig(encoder="minilm", backend="sentence-transformers")) == "float32"
    assert resolve_encoder_precision("artifacts", EmbedConfig(cpu_precision="bfloat16")) == "bfloat16"
    # int8 moves more rankings than bfloat16: asked for, never picked by auto.
    assert resolve_encoder_precision("int8", EmbedConfig(encoder="minilm")) == "int8"
    assert resolve_encoder_precision("artifacts", EmbedConfig(cpu_precision="int8")) == "int8"
    with pytest.raises(DataError, match="encoder_precision='half'"):
        Retriever.load(trained[0] / "run" / "model", encoder_precision="half")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_few_questions_rank_as_in_a_large_batch_and_the_thread_count_is_restored(retriever, monkeypatch):
    """Calls of up to ONE_THREAD_UP_TO questions run torch and numpy's BLAS on one thread; their
    rankings are those of the same questions inside a large batch, and the caller's thread counts are
    left as they were."""
    import torch
    from threadpoolctl import threadpool_limits

    from seeder.serving.retriever import ONE_THREAD_UP_TO
    from seeder.system.threads import blas_libraries

    # The BLAS libraries loaded when the retriever first ran (numpy's among them); other tests may load
    # more later, which the retriever leaves alone.
    assert blas_libraries().info(), "no BLAS library found in this process"

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in blas_libraries().info()]

    texts = retriever.artifacts.dataset.queries_of("val").column("text").to_pylist()[: 4 * ONE_THREAD_UP_TO]
    batched = retriever.retrieve(texts, k=10)
    seen = []
    expand = retriever._expand  # where a call's questions are embedded, seeded and expanded
    monkeypatch.setattr(
        retriever, "_expand", lambda *a, **kw: seen.append((torch.get_num_threads(), blas_threads())) or expand(*a, **kw)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threadpool_limits(limits=2, user_api="blas"):
            alone = [retriever.retrieve([t], k=10)[0] for t in texts[:ONE_THREAD_UP_TO]]
            assert torch.get_num_threads() == 2 and set(blas_threads()) <= {2}
    finally:
        torch.set_num_threads(before)
    assert all(threads == 1 and set(blas) <= {1} for threads, blas in seen) and len(seen) == ONE_THREAD_UP_TO, seen
    assert [[n.id for n in h.nodes] for h in alone] == [[n.id for n in h.nodes] for h in batched[:ONE_THREAD_UP_TO]]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_large_call_is_answered_in_parts_side_by_side_each_on_one_torch_thread(retriever, monkeypatch):
    """On the CPU a call is cut into parts of PART_QUESTIONS questions, at most one per torch thread of
    the caller, answered on the retriever's own threads with torch on one thread; the hits come back in
    the questions' order, equal to answering the call in one part, and the caller's thread count is
    restored."""
    import threading

    import torch

    from seeder.serving.retriever import PART_QUESTIONS

    kg = retriever.artifacts.dataset
    texts = kg.queries_of("val").column("text").to_pylist() + kg.queries_of("test").column("text").to_pylist()
    texts = (texts * 20)[: 4 * PART_QUESTIONS]  # 3 threads: 3 parts, not 4
    answer = retriever._answer
    parts = []

    def recorded(questions, ks, topics, keep=None):
        parts.append((threading.current_thread().name, torch.get_num_threads(), list(questions)))
        return answer(questions, ks, topics, keep)

    monkeypatch.setattr(retriever, "_answer", recorded)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        hits = retriever.retrieve(texts, k=5)
        assert torch.get_num_threads() == 3
        torch.set_num_threads(1)
        alone = retriever.retrieve(texts, k=5)  # one thread: one part, on the caller's thread
    finally:
        torch.set_num_threads(before)
    split, whole = parts[:3], parts[3:]
    assert len(split) == 3 and min(len(questions) for _, _, questions in split) >= PART_QUESTIONS
    assert all(name.startswith("seeder-retrieve") and threads == 1 for name, threads, _ in split)
    assert [q for _, _, questions in split for q in questions] == texts
    assert len(whole) == 1 and whole[0][0] == threading.current_thread().name
    assert [h.question for h in hits] == texts
    assert [[n.id for n in h.nodes] for h in hits] == [[n.id for n in h.nodes] for h in alone]
    assert retriever._parts(2 * PART_QUESTIONS - 1) == 1  # fewer than two parts' worth: one part, every thread


def test_retrieved_triples_are_every_induced_edge_among_each_questions_top_nodes_in_rank_order():
    """All questions' triples in one vectorised pass equal a per-question enumeration of the subgraph's
    edges whose two ends are both retrieved, ordered by the ranks of (head, tail)."""
    from seeder.data.subgraphs import SubgraphSet
    from seeder.serving.retriever import retrieved_triples

    rng = np.random.default_rng(3)
    sizes = np.array([0, 5, 12, 1, 9])
    node_ptr = np.concatenate([[0], np.cumsum(sizes)])
    nodes = np.concatenate([rng.choice(60, size, replace=False) for size in sizes])
    num_edges = np.array([0, 12, 60, 0, 40])
    edge_src = np.concatenate([rng.integers(0, max(size, 1), e) for size, e in zip(sizes, num_edges)]).astype(np.int32)
    edge_dst = np.concatenate([rng.integers(0, max(size, 1), e) for size, e in zip(sizes, num_edges)]).astype(np.int32)
    edge_rel = rng.integers(0, 4, num_edges.sum()).astype(np.int32)
    q = len(sizes)
    subgraphs = SubgraphSet(
        query_ids=np.arange(q),
        splits=np.array(["new"] * q, dtype=object),
        node_ptr=node_ptr,
        nodes=nodes,
        hop=np.zeros(len(nodes), np.int8),
        score=np.zeros(len(nodes), np.float32),
        is_answer=np.zeros(len(nodes), bool),
        path_end=np.zeros(len(nodes), np.float32),
        edge_ptr=np.concatenate([[0], np.cumsum(num_edges)]),
        edge_src=edge_src,
        edge_dst=edge_dst,
        edge_rel=edge_rel,
        answer_ptr=np.zeros(q + 1, np.int64),
        answers=np.zeros(0, np.int64),
    )
    # Each question retrieves its subgraph's nodes in a random order, all of them or the first part
    # (so some edges leave the retrieved set); one also retrieves a node outside its subgraph.
    keep = [0, 5, 8, 1, 9]
    retrieved = [list(rng.permutation(nodes[node_ptr[i] : node_ptr[i + 1]])[: keep[i]]) for i in range(q)]
    retrieved[2].insert(1, 999)
    question = np.concatenate([np.full(len(r), i) for i, r in enumerate(retrieved)]).astype(np.int64)
    rank = np.concatenate([np.arange(len(r)) for r in retrieved]).astype(np.int64)
    ids = np.concatenate([np.asarray(r, np.int64) for r in retrieved])
    ptr, heads, relations, tails = retrieved_triples(subgraphs, question, rank, ids)
    for i, top in enumerate(retrieved):
        rank_of = {node: r for r, node in enumerate(top)}
        lo, hi = subgraphs.edge_ptr[i], subgraphs.edge_ptr[i + 1]
        local = nodes[node_ptr[i] : node_ptr[i + 1]]
        want = [
            (local[s], r, local[d])
            for s, d, r in zip(edge_src[lo:hi], edge_dst[lo:hi], edge_rel[lo:hi])
            if local[s] in rank_of and local[d] in rank_of
        ]
        want.sort(key=lambda t: (rank_of[t[0]], rank_of[t[2]]))  # stable: edges of one pair keep their order
        got = list(
            zip(heads[ptr[i] : ptr[i + 1]].tolist(), relations[ptr[i] : ptr[i + 1]].tolist(), tails[ptr[i] : ptr[i + 1]].tolist())
        )
        assert got == [(int(h), int(r), int(t)) for h, r, t in want]
    assert ptr[-1] == len(heads) and min(np.diff(ptr)[[1, 2, 4]]) >= 5


@pytest.mark.e2e
@pytest.mark.slow
def test_hits_carry_names_types_triples_and_a_prompt(retriever):
    kg = retriever.artifacts.dataset
    question = kg.queries_of("test").column("text")[0].as_py()
    hit = retriever.retrieve(question, k=10)[0]
    names = kg.nodes.column("name").to_pylist()
    assert [n.rank for n in hit.nodes] == list(range(1, 11))
    assert all(names[n.id] == n.name and n.type for n in hit.nodes)
    assert 0 < hit.set_size and all((n.step >= 0) == (n.rank <= hit.set_size) for n in hit.nodes)
    # Every triple is an edge of the graph between two retrieved nodes.
    edges = set(zip(np.asarray(kg.table("edges").column("src")), np.asarray(kg.table("edges").column("dst"))))
    by_name = {n.name: n.id for n in hit.nodes}
    assert all((by_name[h], by_name[t]) in edges for h, _, t in hit.triples)
    # Each triple's provenance names this version and the edge's row, whose ids are the triple's.
    table = kg.table("edges").to_pydict()
    relation_names = kg.relation_names
    assert len(hit.provenance) == len(hit.triples) and hit.triples
    for (h, r, t), source in zip(hit.triples, hit.provenance):
        row = source["edge"]
        assert source["dataset"] == hit.dataset
        assert (names[table["src"][row]], relation_names[table["relation"][row]], names[table["dst"][row]]) == (h, r, t)
    assert hit.to_dict()["provenance"] == hit.provenance
    # One value of k per question (as the service batches requests): each gets the triples among its own top k.
    few, many = retriever.retrieve([question, question], k=[3, 10])
    assert len(few.nodes) == 3 and [n.id for n in many.nodes] == [n.id for n in hit.nodes]
    assert {x for h, _, t in few.triples for x in (h, t)} <= {n.name for n in few.nodes}
    prompt = hit.to_prompt()
    assert prompt.startswith(f"Question: {question}") and hit.nodes[0].name in prompt
    assert all(f"{h} | {r} | {t}" in prompt for h, r, t in hit.triples)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_prior_reads_a_calls_questions_once_for_the_expansion_and_the_paths(retriever, monkeypatch):
    """The relation-path prior's terms choose the expansion's relations and each node's explaining path;
    a call computes them once, and answers as the call before it (nodes and paths)."""
    import seeder.retrieve.khop as khop

    assert retriever.prior is not None and retriever.config.expand.relation_score == "learned"
    questions = retriever.artifacts.dataset.queries_of("test").column("text").to_pylist()[:5]
    before = retriever.retrieve(questions, k=5)
    calls = []
    real = khop.prior_path_terms
    monkeypatch.setattr(khop, "prior_path_terms", lambda *a, **kw: calls.append(len(a[3])) or real(*a, **kw))
    after = retriever.retrieve(questions, k=5)
    assert calls == [len(questions)]
    assert [[(n.id, n.path) for n in h.nodes] for h in after] == [[(n.id, n.path) for n in h.nodes] for h in before]
    assert any(n.path for h in after for n in h.nodes)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_question_without_a_linkable_entity_is_seeded_densely(retriever):
    from seeder.retrieve.seeds import dense_seeds

    question = "zzzz qqqq nothing here"
    subgraphs, features = retriever.subgraphs([question])
    dense, _ = dense_seeds(features, retriever.artifacts.node_features, retriever.config.seed.k0)
    assert subgraphs.nodes[subgraphs.hop == 0].tolist() == dense[0][dense[0] >= 0].tolist()
    assert len(retriever.retrieve([question], k=5)[0].nodes) == 5


@pytest.mark.e2e
@pytest.mark.slow
def test_bad_questions_are_clear_errors(retriever):
    from seeder.system.io import DataError

    with pytest.raises(DataError, match="non-empty"):
        retriever.retrieve(["ok", "  "])


@pytest.mark.e2e
@pytest.mark.slow
def test_the_pyfunc_model_returns_the_apis_rankings(trained, retriever):
    import mlflow
    import pandas as pd

    root, run_id = trained
    questions = retriever.artifacts.dataset.queries_of("test").column("text").to_pylist()[:5]
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    frame = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(pd.DataFrame({"question": questions}), params={"k": 4})
    expected = retriever.retrieve_frame(questions, k=4)
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), expected, check_dtype=False)


@pytest.mark.e2e
@pytest.mark.slow
def test_batch_command_writes_one_result_per_question(trained, retriever, tmp_path):
    root, _ = trained
    questions = retriever.artifacts.dataset.queries_of("test").column("text").to_pylist()[:3]
    (tmp_path / "q.txt").write_text("\n".join(questions) + "\n")
    seeder = str(Path(sys.executable).parent / "seeder")
    for out in (tmp_path / "r.jsonl", tmp_path / "r.parquet"):
        done = _run(
            [
                seeder,
                "retrieve",
                "--model",
                str(root / "run" / "model"),
                "--file",
                str(tmp_path / "q.txt"),
                "--out",
                str(out),
                "-k",
                "4",
            ],
            env=ENV,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    expected = retriever.retrieve(questions, k=4)
    assert [[n["id"] for n in r["nodes"]] for r in rows] == [[n.id for n in h.nodes] for h in expected]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r.parquet").column("question").to_pylist() == questions
    # One question as JSON on stdout, compiled: the same nodes as the eager retriever's.
    done = _run(
        [seeder, "retrieve", "--model", str(root / "run" / "model"), "--json", "--compile", "-k", "4", questions[0]], env=ENV
    )
    assert done.returncode == 0 and "eagerly" not in done.stderr, done.stderr[-2000:]
    assert [n["id"] for n in json.loads(done.stdout)["nodes"]] == [n.id for n in expected[0].nodes]


def test_a_model_carries_to_another_graph_in_the_encoders_feature_space_and_says_it_is_zero_shot(tmp_path, capsys):
    """Features every graph shares (``reduce.dim: 0``): a model trained on one graph ranks another with other
    relations (ids, count and texts) and says it runs zero-shot; with per-graph PCA features it is an
    error that names the way out."""
    from seeder import Retriever
    from seeder.preprocessing.artifacts import FingerprintMismatch

    home, _, _ = hand_built_artifacts(tmp_path / "home", "dense", relations=3, reduce_dim=0)
    other, _, texts = hand_built_artifacts(
        tmp_path / "other",
        "dense",
        relations=5,
        reduce_dim=0,
        seed=4,
        step_budget={"expansion_sizes": [2, 4], "frontier_caps": [8, 8]},
    )
    done = _run(
        [
            sys.executable,
            "-m",
            "seeder.training.loop",
            "--artifacts",
            str(home),
            "--out",
            str(tmp_path / "run"),
            "train.epochs=2",
            "train.warmup_epochs=1",
            "train.batch_size=2",
            "train.num_threads=1",
        ],
        env=dict(ENV, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = tmp_path / "run" / "model"
    retriever = Retriever.load(model, artifacts=other)
    assert retriever.zero_shot
    assert retriever.schedule.expansion_sizes == (2, 4)  # the steps derived for the graph it ranks
    assert "zero-shot: model" in capsys.readouterr().err
    result, subgraphs = retriever.rank_split("val")
    assert len(result.query_ids) == 8 and (result.set_size > 0).all()
    for row, size, i in zip(result.ranking, result.set_size, range(len(result.query_ids))):
        own = subgraphs.nodes[subgraphs.node_ptr[i] : subgraphs.node_ptr[i + 1]]
        assert set(row[:size].tolist()) <= set(own.tolist())  # the other graph's own candidates
    assert len(retriever.retrieve(texts[:2], k=3)[0].nodes) == 3
    at_home = Retriever.load(model, artifacts=home)
    trained_steps = tuple(at_home.info.config.train.expansion_sizes)
    assert not at_home.zero_shot and at_home.schedule.expansion_sizes == trained_steps != (2, 4)  # its training steps
    pca_home, _, _ = hand_built_artifacts(tmp_path / "pca-home", "dense", relations=3)
    pca_other, pca_model, _ = hand_built_artifacts(tmp_path / "pca-other", "dense", relations=5, seed=4, trained_on=pca_home)
    with pytest.raises(FingerprintMismatch, match="reduce.dim=0"):
        Retriever.load(pca_model, artifacts=pca_other)


@pytest.mark.parametrize("strategy", ["dense", "entity", "dense+entity", "bm25", "hybrid", "given"])
def test_every_seeding_strategy_serves_new_questions_like_preprocessing(tmp_path, strategy):
    """One seeding function for preprocessing and new questions: a preprocessed question's text gets
    the seeds and the subgraph preprocessing stored, whatever ``seed.strategy`` built the artifacts
    (``given`` reads the topic attribute, which a new question lacks: its topic is passed in)."""
    from seeder import Retriever

    artifacts, model, texts = hand_built_artifacts(tmp_path, strategy)
    retriever = Retriever.load(model, artifacts=artifacts)
    _, stored = retriever.rank_split("val")
    topics = list(range(4, 12)) if strategy == "given" else None
    online, _ = retriever.subgraphs(texts[4:], topics=topics)
    np.testing.assert_array_equal(online.nodes, stored.nodes)
    hits = retriever.retrieve(texts[4:6], k=3, topics=topics[:2] if topics else None)
    assert [len(h.nodes) for h in hits] == [3, 3]


@pytest.mark.e2e
@pytest.mark.slow
def test_warm_up_compiles_every_graph_a_call_needs(trained):
    """After ``warm_up`` a compiled retriever answers calls of any size without compiling again."""
    import torch._dynamo

    from seeder import Retriever

    compiled = Retriever.load(trained[0] / "run" / "model", compiled=True)
    compiled.warm_up()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs > 0
    questions = compiled.artifacts.dataset.queries_of("test").column("text").to_pylist()
    for n in (1, 3, 9, 40, 1):
        compiled.retrieve((questions * 40)[:n], k=5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_a_model_of_several_graphs_is_at_home_on_each_and_zero_shot_elsewhere(tmp_path, capsys):
    """``graphs_record``: a model trained on two graphs (as pipelines/train.py records it) runs on either
    without a mismatch and is zero-shot only on a third."""
    from seeder import Retriever
    from seeder.config import load_config
    from seeder.policy.checkpoint import graphs_record
    from seeder.preprocessing.artifacts import open_artifacts
    from seeder.training.loop import build_state, export_best

    graphs = [
        hand_built_artifacts(tmp_path / name, "dense", relations=r, reduce_dim=0, seed=s)[0]
        for name, r, s in (("a", 3, 3), ("b", 5, 4), ("c", 4, 5))
    ]
    every = [open_artifacts(g) for g in graphs[:2]]
    config = load_config(
        None,
        [
            "embed.encoder=hash",
            "embed.hash_dim=32",
            "reduce.dim=0",
            "model.hidden_dim=16",
            "model.num_layers=1",
            "train.expansion_sizes=[3,3]",
            "train.frontier_caps=[8,8]",
        ],
    )
    model = export_best(build_state(config, 32, 1, graphs_record(every, [str(g) for g in graphs[:2]])), tmp_path / "model")
    assert not Retriever.load(model, artifacts=graphs[0]).zero_shot
    assert not Retriever.load(model, artifacts=graphs[1]).zero_shot
    assert "zero-shot" not in capsys.readouterr().err
    assert Retriever.load(model, artifacts=graphs[2]).zero_shot
    assert f"trained on other graphs ({graphs[0]}, {graphs[1]})" in capsys.readouterr().err


def test_reload_switches_to_an_updated_version_and_the_old_retriever_keeps_its_own(tmp_path, capsys):
    """A model of one version of a graph serves the next version (``seeder import ... --update``, built
    in the encoder's feature space) without retraining: ``reload`` gives a retriever whose answers name
    the new version and see its new edges, while the old retriever still answers from the old one."""
    from seeder import Retriever
    from seeder.data.store import open_dataset
    from seeder.data.update import update_dataset
    from seeder.policy.checkpoint import load_model

    artifacts, model, questions = hand_built_artifacts(tmp_path / "v1", "dense", reduce_dim=0)
    parent = tmp_path / "v1" / "dataset"
    changes = tmp_path / "changes.tsv"
    changes.write_text(
        "head\trelation\ttail\top\nentity alpha\trelation a\tentity omega\tadd\nentity beta\trelation b\tentity psi\tadd\n"
    )
    removed = tmp_path / "nodes.csv"
    removed.write_text("id,text,type,op\nplace 5,,,remove\n")  # its id stays, as a placeholder never shown
    update_dataset(parent, tmp_path / "v2" / "dataset", triples_path=changes, nodes_path=removed)
    updated = preprocess_by_hand(tmp_path / "v2" / "dataset", tmp_path / "v2" / "artifacts", load_model(model)[1].config)
    v1, v2 = open_dataset(parent).fingerprint, open_dataset(tmp_path / "v2" / "dataset").fingerprint
    assert open_dataset(tmp_path / "v2" / "dataset").lineage == [v1]

    old = Retriever.load(model)
    old.warm_up()
    new = old.reload(updated)
    assert "trained on an earlier version of this graph" in capsys.readouterr().err
    assert not new.zero_shot and new.model is old.model and new.encoder is old.encoder
    assert (old.dataset_version, new.dataset_version) == (v1, v2)
    before, after = old.retrieve(questions, k=60), new.retrieve(questions, k=60)
    assert {h.dataset for h in before} == {v1} and {h.dataset for h in after} == {v2}
    added = {("entity alpha", "relation a", "entity omega"), ("entity beta", "relation b", "entity psi")}
    assert not added & {t for h in before for t in h.triples}
    assert added & {t for h in after for t in h.triples}  # the new edges are in the new version's subgraphs
    sources = {t: s for h in after for t, s in zip(h.triples, h.provenance)}
    assert {sources[t]["file"] for t in added & set(sources)} == {"changes.tsv"}
    assert {sources[t]["dataset"] for t in added & set(sources)} == {v2}
    assert old.retrieve(questions[:1], k=5)[0].dataset == v1  # the old one is untouched by the switch
    assert "place 5" in {n.name for h in before for n in h.nodes}
    assert {n.name for h in after for n in h.nodes} & {"place 5", "(removed)"} == set()
    assert int((~new.live_nodes).sum()) == 1 and old.live_nodes is None


def test_reload_refuses_artifacts_whose_preprocessing_has_not_finished(tmp_path):
    """A switch never goes to a version that is half there: artifacts of an update killed (or still
    running) before a stage finished are refused, naming the stage and the rerun with its ``--update``,
    and once that stage is complete with the planned fingerprint the same switch succeeds."""
    import shutil

    from seeder import Retriever
    from seeder.system.io import DataError, read_manifest, write_manifest
    from tests.pipelines.test_serve_switch import _versions

    model, v1, v2, questions, (_, version2) = _versions(tmp_path)
    planned = {stage: f"planned {stage}" for stage in ("features", "subgraphs")}
    for stage, fingerprint in planned.items():  # as preprocessing records them (hand-built ones have none)
        write_manifest(Path(v2) / stage, {**read_manifest(Path(v2) / stage), "fingerprint": fingerprint})
    top = read_manifest(v2)
    write_manifest(v2, {**top, "fingerprints": planned, "update": {"parent": {"path": str(v1)}}})
    old = Retriever.load(model, artifacts=v1)
    stage_manifest = Path(v2) / "subgraphs" / "manifest.json"
    shutil.move(stage_manifest, tmp_path / "held")
    with pytest.raises(DataError, match=rf"subgraphs: this stage is not finished.*--update {v1}"):
        old.reload(v2)
    shutil.move(tmp_path / "held", stage_manifest)
    assert old.reload(v2).retrieve(questions[:1], k=5)[0].dataset == version2


def test_reload_refuses_another_pca_space_and_names_the_way_out(tmp_path):
    """With a PCA fitted again for the update (``reduce.dim`` > 0), the model's features are not the
    update's: an error that says to build in the encoder's space or retrain."""
    from seeder import Retriever
    from seeder.data.update import update_dataset
    from seeder.policy.checkpoint import load_model
    from seeder.preprocessing.artifacts import FingerprintMismatch

    artifacts, model, _ = hand_built_artifacts(tmp_path / "v1", "dense", reduce_dim=256)
    changes = tmp_path / "changes.tsv"
    changes.write_text("head\trelation\ttail\top\nentity alpha\trelation a\tentity omega\tadd\n")
    update_dataset(tmp_path / "v1" / "dataset", tmp_path / "v2" / "dataset", triples_path=changes)
    updated = preprocess_by_hand(tmp_path / "v2" / "dataset", tmp_path / "v2" / "artifacts", load_model(model)[1].config)
    with pytest.raises(FingerprintMismatch, match="reduce.dim=0"):
        Retriever.load(model).reload(updated)


def test_filters_keep_the_ranking_of_the_nodes_they_let_through(tmp_path, capsys):
    """``types`` and ``where`` filter what is shown, not the expansion: the kept nodes in their unfiltered
    order and scores, ranked 1, 2, ...; the retrieved set counts only them; errors name what is wrong."""
    from seeder import Retriever
    from seeder.cli.main import main
    from seeder.system.io import DataError

    _, model, questions = hand_built_artifacts(tmp_path, "dense")
    retriever = Retriever.load(model)
    full = retriever.retrieve(questions, k=60)
    places = retriever.retrieve(questions, k=60, types=["place"])
    named = retriever.retrieve(questions, k=60, where={"name": ["entity alpha", "place 3"]})
    for every, kept, wanted in (
        (full, places, lambda n: n.type == "place"),
        (full, named, lambda n: n.name in ("entity alpha", "place 3")),
    ):
        for a, b in zip(every, kept):
            expected = [n for n in a.nodes if wanted(n)]
            assert [(n.id, n.score, n.step) for n in b.nodes] == [(n.id, n.score, n.step) for n in expected]
            assert [n.rank for n in b.nodes] == list(range(1, len(b.nodes) + 1))
            assert b.set_size == sum(n.rank <= a.set_size for n in expected)
    assert any(h.nodes for h in places) and any(h.set_size < f.set_size for h, f in zip(places, full))
    assert [h.nodes for h in retriever.retrieve(questions, k=60)] == [h.nodes for h in full]  # no filter left behind
    with pytest.raises(DataError, match="no such column"):
        retriever.retrieve(questions[:1], where={"colour": "red"})
    with pytest.raises(DataError, match="no node matches.*node types include entity, place"):
        retriever.retrieve(questions[:1], types=["film"])
    assert main(["retrieve", "--model", str(model), questions[0], "--type", "entity", "-k", "5", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["nodes"] and {n["type"] for n in shown["nodes"]} == {"entity"}
    assert main(["retrieve", "--model", str(model), questions[0], "--where", "colour"]) == 2
    assert "--where 'colour': write COLUMN=VALUE" in capsys.readouterr().err


def test_every_retrieved_node_comes_with_a_path_of_graph_edges_from_a_seed(tmp_path):
    """``RetrievedNode.path``: for every node of the retrieved set, hops from one of its question's seeds
    that chain up to the node, each an edge of the graph in the direction it names, no longer than the
    node's expansion step; a seed's path and that of a node outside the set are empty."""
    from seeder import Retriever

    _, model, questions = hand_built_artifacts(tmp_path, "dense")
    retriever = Retriever.load(model)
    kg = retriever.artifacts.dataset
    names = np.array(kg.nodes.column("name").to_pylist(), dtype=object)
    relations = np.array(kg.relation_names, dtype=object)
    edges = kg.table("edges")
    facts = set(
        zip(
            names[edges.column("src").to_numpy()],
            relations[edges.column("relation").to_numpy()],
            names[edges.column("dst").to_numpy()],
        )
    )
    expanded = 0
    for hits in retriever.retrieve(questions, k=60):
        seeds = {n.name for n in hits.nodes if n.step == 0}
        for node in hits.nodes:
            if node.step <= 0:
                assert node.path == []
                continue
            expanded += 1
            assert 1 <= len(node.path) <= node.step and node.path[0][0] in seeds and node.path[-1][3] == node.name
            assert all(a[3] == b[0] for a, b in zip(node.path, node.path[1:]))
            for origin, relation, direction, to in node.path:
                assert (origin, relation, to) in facts if direction == "forward" else (to, relation, origin) in facts
    assert expanded > len(questions)
    hits = retriever.retrieve(questions[:1], k=60)[0]
    walked = next(n for n in hits.nodes if n.path)
    assert f"via {walked.path_text()}" in hits.to_prompt(paths=True) and "via" not in hits.to_prompt()
    assert hits.to_dict()["nodes"][hits.nodes.index(walked)]["path"] == [list(h) for h in walked.path]


def test_a_model_ranks_artifacts_updated_from_its_own_with_their_pca(capsys):
    """Artifacts that ``pipelines/preprocess.py --update`` built from the model's (their PCA kept, at any
    distance) are at home; artifacts with another features fingerprint and no such lineage are refused."""
    from types import SimpleNamespace

    from seeder.preprocessing.artifacts import FingerprintMismatch
    from seeder.serving.retriever import check_compatible

    info = SimpleNamespace(
        feature_dim=8, artifacts={"path": "a1", "dataset_fingerprint": "d1", "fingerprints": {"features": "f1"}}
    )

    def artifacts(features: str, lineage: list[str]):
        manifest = {"dataset_fingerprint": "d3", "fingerprints": {"features": features}}
        if lineage:
            manifest["update"] = {"parent": {"features_lineage": lineage}}
        return SimpleNamespace(node_features=np.zeros((3, 8)), manifest=manifest, path="a3", fingerprint="x")

    assert check_compatible(info, artifacts("f3", ["f2", "f1"]), "m") is False
    assert "trained on an earlier version of this graph" in capsys.readouterr().err
    with pytest.raises(FingerprintMismatch, match="features fingerprint f1 != f3"):
        check_compatible(info, artifacts("f3", ["f2"]), "m")
