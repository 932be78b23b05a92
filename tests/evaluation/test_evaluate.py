"""`seeder evaluate` on a tiny artifacts directory written by hand in the artifacts layout."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seeder.cli.main import main
from seeder.config import SeederConfig, to_dict
from seeder.data.store import open_dataset, write_dataset
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.seeds import dense_seeds
from seeder.system.io import write_manifest


def normalised(rng, rows, dim):
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def artifacts(tmp_path):
    """40 nodes, 8 val queries: the first four have the feature of their answer (dense finds it at
    rank 0), the other four random features; attribute ``kind`` tells them apart."""
    rng = np.random.default_rng(3)
    n, r, q = 40, 2, 8
    src, dst = rng.integers(0, n, 120), rng.integers(0, n, 120)
    names = [f"node {i}" for i in range(n)]
    answers = [[int(a)] for a in rng.choice(n, q, replace=False)]
    answers[5].append((answers[5][0] + 1) % n)
    queries = pa.table(
        {
            "id": np.arange(q) + 500,
            "text": [f"question {i}" for i in range(q)],
            "answers": answers,
            "split": ["val"] * q,
            "kind": ["exact"] * 4 + ["random"] * 4,
        }
    )
    dataset = write_dataset(
        tmp_path / "kg",
        pa.table({"id": np.arange(n), "type": ["e"] * n, "name": names, "text": names}),
        pa.table({"id": np.arange(r, dtype=np.int32), "name": ["a", "b"], "text": ["a", "b"], "inverse_text": ["a-", "b-"]}),
        pa.table({"src": src, "dst": dst, "relation": rng.integers(0, r, 120).astype(np.int32)}),
        queries,
    )
    kg = open_dataset(dataset)
    nf, rf, qf = normalised(rng, n, 8), normalised(rng, 2 * r, 8), normalised(rng, q, 8)
    qf[:4] = nf[[a[0] for a in answers[:4]]]
    config = SeederConfig()
    config.expand.budget, config.expand.keep_per_hop, config.eval.ranking_length = 10, [4, 6], 15
    out = tmp_path / "artifacts"
    (out / "features").mkdir(parents=True)
    for name, arr in (("node", nf), ("relation", rf), ("query", qf), ("query_ids", np.arange(q) + 500)):
        np.save(out / "features" / f"{name}.npy", arr)
    write_manifest(out / "features", {"stage": "features"})
    seeds, scores = dense_seeds(qf, nf, 3)
    answer_ptr = np.concatenate([[0], np.cumsum([len(a) for a in answers])])
    sg = expand_queries(
        kg,
        nf,
        rf,
        qf,
        seeds,
        scores,
        config.expand,
        np.arange(q) + 500,
        np.array(["val"] * q, dtype=object),
        answer_ptr,
        np.concatenate(answers),
    )
    (out / "subgraphs").mkdir()
    pq.write_table(sg.to_arrow(), out / "subgraphs" / "part-00000.parquet")
    write_manifest(out / "subgraphs", {"stage": "subgraphs"})
    write_manifest(out, {"dataset": str(dataset), "config": to_dict(config)})
    return out, sg


def test_evaluate_cli_side_by_side(artifacts, tmp_path, capsys):
    path, sg = artifacts
    report_path = tmp_path / "report.json"
    rc = main(["evaluate", "--artifacts", str(path), "--method", "dense", "--method", "khop", "--json", str(report_path)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "dense" in table and "khop" in table and "kind=exact (n=4)" in table
    report = json.loads(report_path.read_text())
    assert set(report["methods"]) == {"dense", "khop"} and report["queries"] == 8
    for method in ("dense", "khop"):
        groups = report["methods"][method]
        assert list(groups) == ["all", "kind=exact", "kind=random"]
        assert groups["kind=exact"]["hit_at_1"] == 1.0 and groups["kind=exact"]["mrr"] == 1.0
        assert groups["all"]["queries"] == 8
        for value in groups["all"].values():
            assert value >= 0
    # The khop retrieved set is the subgraph: its Hit@any is the subgraph ceiling.
    assert report["methods"]["khop"]["all"]["hit_any"] == report["ceiling"]["all"]["hit_any"]
    assert report["methods"]["khop"]["all"]["set_size"] == pytest.approx(sg.sizes.mean())
    assert report["methods"]["dense"]["all"]["set_size"] == 10.0
    expected_hits = np.add.reduceat(sg.is_answer, sg.node_ptr[:-1]) > 0
    assert report["ceiling"]["all"]["hit_any"] == pytest.approx(expected_hits.mean())


def test_evaluate_overrides_and_errors(artifacts, capsys):
    path, _ = artifacts
    assert main(["evaluate", "--artifacts", str(path), "--method", "dense", "eval.ks=[1,3]"]) == 0
    assert "hit_at_3" in capsys.readouterr().out
    assert main(["evaluate", "--artifacts", str(path), "--method", "nope"]) == 2
    assert "unknown retrieval method 'nope'" in capsys.readouterr().err
    assert main(["evaluate", "--artifacts", str(path), "--split", "test"]) == 2
    assert "no test queries" in capsys.readouterr().err
    (path / "features" / "manifest.json").unlink()
    assert main(["evaluate", "--artifacts", str(path), "--method", "dense"]) == 2
    assert "incomplete" in capsys.readouterr().err


def test_methods_repeated_comma_listed_or_defaulted_agree(artifacts, tmp_path, capsys):
    path, _ = artifacts
    spellings = [
        ["--method", "dense", "--method", "khop"],
        ["--method", "dense,khop"],
        ["--methods", "khop,dense", "--method", "dense"],
        [],
    ]
    reports = []
    for i, spelling in enumerate(spellings):
        assert main(["evaluate", "--artifacts", str(path), *spelling, "--json", str(tmp_path / f"{i}.json")]) == 0
        reports.append(json.loads((tmp_path / f"{i}.json").read_text()))
    assert all(r["methods"] == reports[0]["methods"] and r["split"] == "val" for r in reports)
    from seeder.evaluation.evaluate import resolve_methods

    assert resolve_methods(["khop,dense", "dense"], None) == ["khop", "dense"]  # given order, repeats dropped
    assert main(["evaluate", "--artifacts", str(path), "--method", "seeder"]) == 2
    assert "needs --model" in capsys.readouterr().err
