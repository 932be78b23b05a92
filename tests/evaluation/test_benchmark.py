"""`seeder benchmark` on tiny artifacts (synthetic graph, hash encoder): report files, bold maxima,
per-attribute tables, CSV equal to the Markdown, the budget plot and the MLflow run. The Ray path
(pipelines/benchmark.py) is tested in tests/pipelines/test_benchmark.py."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seeder.config import ConfigError
from seeder.evaluation import benchmark as bm
from seeder.preprocessing.artifacts import open_artifacts
from seeder.system.io import check_replaceable
from tests.datasets import write_tiny_dataset

REPO = Path(__file__).resolve().parents[2]
PREPROCESS = REPO / "pipelines" / "preprocess.py"
OVERRIDES = [
    "embed.encoder=hash",
    "seed.strategy=dense",
    "expand.relation_score=cosine",
    "embed.hash_dim=64",
    "reduce.dim=16",
    "expand.budget=30",
    "expand.keep_per_hop=[12,18]",
]
METHODS = "dense,khop,ppr,bm25"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def tiny_dataset(directory: Path) -> Path:
    """300 nodes, 1,500 edges, 4 relations, 90 queries over three splits; answers 1 or 2 hops away."""
    return write_tiny_dataset(directory, 90, seed=11, two_hop_answers=True, id_stride=5)


@pytest.fixture(scope="module")
def artifacts_dir(tmp_path_factory) -> Path:
    """The tiny dataset preprocessed by pipelines/preprocess.py with the hash encoder."""
    root = tmp_path_factory.mktemp("bench")
    dataset = tiny_dataset(root / "data")
    out = root / "art"
    cmd = [
        sys.executable,
        str(PREPROCESS),
        "--dataset",
        str(dataset),
        "--out",
        str(out),
        "--ray-address",
        "local",
        "--num-cpus",
        "2",
        *OVERRIDES,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seeder.cli", "benchmark", *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=timeout,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def cli_run(artifacts_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    env = _env(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}")
    result = run_cli(
        "--artifacts",
        str(artifacts_dir),
        "--methods",
        METHODS,
        "--split",
        "test",
        "--out",
        str(root / "out"),
        "--latency-queries",
        "5",
        "--budgets",
        "5,10,30",
        "--budget-queries",
        "20",
        "--experiment",
        "bench-test",
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result


def _markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Section title -> the rows (cells) of the method table under it."""
    tables, title = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].split(" (n=")[0]
        elif line.startswith("| ") and title is not None and not line.startswith("| Method") and not line.startswith("| Budget"):
            tables.setdefault(title, []).append([c.strip() for c in line.strip("|").split("|")])
    return tables


def _number(cell: str) -> float:
    return float(cell.strip("*"))


@pytest.mark.e2e
def test_report_has_a_row_per_method_and_bold_maxima(cli_run):
    root, result = cli_run
    out = root / "out"
    for name in ("table1.md", "table1.csv", "report.json", "budget.png", "budget.csv"):
        assert (out / name).is_file(), name
    text = (out / "table1.md").read_text()
    assert text in result.stdout  # the Markdown table is printed
    tables = _markdown_tables(text)
    overall = tables["All queries"]
    assert [row[0] for row in overall] == ["Dense", "K-HOP-W-FILTER", "PPR", "BM25"]
    for col in range(1, 7):  # Hit@1 .. Recall@any: exactly the column maxima are bold
        values = [_number(row[col]) for row in overall]
        bold = [row[col].startswith("**") for row in overall]
        assert bold == [v == max(values) for v in values], (col, overall)
    report = json.loads((out / "report.json").read_text())
    assert report["split"] == "test" and report["queries"] == report["ceiling"]["all"]["queries"] > 0
    for row, method in zip(overall, METHODS.split(",")):
        assert _number(row[1]) == pytest.approx(report["methods"][method]["all"]["hit_at_1"], abs=5e-5)
        latency = report["latency"][method]
        assert latency["latency_queries"] == 5 and 0 < latency["p50_ms"] <= latency["p95_ms"]
        assert latency["batched_ms_per_query"] > 0
        assert float(row[8]) == pytest.approx(latency["p50_ms"], abs=0.06)


@pytest.mark.e2e
def test_per_attribute_tables(cli_run):
    root, _ = cli_run
    report = json.loads((root / "out" / "report.json").read_text())
    groups = [g for g in report["ceiling"] if g != "all"]
    assert groups and all(g.startswith("hop=") for g in groups)
    tables = _markdown_tables((root / "out" / "table1.md").read_text())
    counts = 0
    for group in groups:
        assert len(tables[group]) == 4
        counts += report["ceiling"][group]["queries"]
        for row, method in zip(tables[group], METHODS.split(",")):
            assert _number(row[3]) == pytest.approx(report["methods"][method][group]["mrr"], abs=5e-5)
    assert counts == report["queries"]


@pytest.mark.e2e
def test_csv_matches_markdown(cli_run):
    root, _ = cli_run
    tables = _markdown_tables((root / "out" / "table1.md").read_text())
    with open(root / "out" / "table1.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    report = json.loads((root / "out" / "report.json").read_text())
    assert len(rows) == 4 * len(report["ceiling"])
    columns = ["hit_at_1", "hit_at_5", "mrr", "recall_at_20", "hit_any", "recall_any"]
    for row in rows:
        title = "All queries" if row["group"] == "all" else row["group"]
        md = next(r for r in tables[title] if r[0] == row["name"])
        for i, column in enumerate(columns, start=1):
            assert f"{float(row[column]):.4f}" == md[i].strip("*"), (row, md)
        assert f"{float(row['set_size']):.1f}" == md[7]
        assert (row["p50_ms"] != "") == (row["group"] == "all")


@pytest.mark.e2e
def test_budget_plot_and_curves(cli_run):
    root, _ = cli_run
    assert (root / "out" / "budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((root / "out" / "report.json").read_text())
    curves = report["budget"]
    assert curves["budgets"] == [5, 10, 30] and curves["queries"] == 20
    for method in ("dense", "khop"):
        hits = [curves[method][str(b)]["hit_any"] for b in curves["budgets"]]
        sizes = [curves[method][str(b)]["set_size"] for b in curves["budgets"]]
        assert hits == sorted(hits), (method, hits)  # a larger budget never loses an answer here
        assert all(s <= b + 1e-9 for s, b in zip(sizes, curves["budgets"]))
    assert curves["dense"]["30"]["set_size"] == 30


@pytest.mark.e2e
def test_mlflow_run_has_metrics_and_artifacts(cli_run):
    root, _ = cli_run
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bench-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["methods"] == METHODS and run.data.params["split"] == "test"
    report = json.loads((root / "out" / "report.json").read_text())
    assert run.data.metrics["ppr.hit_at_1"] == pytest.approx(report["methods"]["ppr"]["all"]["hit_at_1"])
    assert run.data.metrics["dense.hop_1.mrr"] == pytest.approx(report["methods"]["dense"]["hop=1"]["mrr"])
    assert "khop.p95_ms" in run.data.metrics
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"table1.md", "table1.csv", "report.json", "budget.png"} <= names


def test_method_lists_and_errors(tmp_path):
    everything = bm.resolve_methods("all", None)
    assert "seeder" not in everything and {"dense", "khop", "ppr"} <= set(everything)
    assert "prior" not in everything and bm.resolve_methods("prior,khop", None) == ["prior", "khop"]  # named only
    assert everything[:2] == ["dense", "khop"]
    assert bm.resolve_methods("all", "some/model.pt")[-1] == "seeder"
    with pytest.raises(ConfigError, match="unknown"):
        bm.resolve_methods("dense,nope", None)
    with pytest.raises(ConfigError, match="--model"):
        bm.resolve_methods("seeder", None)
    # --method repeated, comma lists, or both; repeats dropped; no --method means all.
    assert bm.resolve_methods(["dense,ppr", "khop", "dense"], None) == ["dense", "ppr", "khop"]
    assert bm.resolve_methods(None, None) == everything
    result = run_cli("--artifacts", str(tmp_path / "missing"), "--method", "dense", "--experiment", "none")
    assert result.returncode == 2 and "no artifacts manifest" in result.stderr


@pytest.mark.parametrize("option", [["--ray"], ["--ray-address", "local"], ["--num-cpus", "2"]])
def test_ray_options_point_to_the_ray_entry_point(tmp_path, option):
    result = run_cli("--artifacts", str(tmp_path), *option)
    assert result.returncode == 2
    assert f"{option[0]}: ranking on Ray is `python pipelines/benchmark.py` with the same arguments" in result.stderr


def test_stratified_sample_keeps_proportions():
    strata = np.array(["1"] * 600 + ["2"] * 300 + ["3"] * 100)
    picked = bm.stratified_sample(len(strata), 100, strata, seed=5)
    assert len(picked) == 100 and len(np.unique(picked)) == 100
    assert [int((strata[picked] == s).sum()) for s in ("1", "2", "3")] == [60, 30, 10]
    assert np.array_equal(picked, bm.stratified_sample(len(strata), 100, strata, seed=5))
    assert not np.array_equal(picked, bm.stratified_sample(len(strata), 100, strata, seed=6))
    assert np.array_equal(bm.stratified_sample(10, 20, None, 0), np.arange(10))


@pytest.mark.e2e
def test_in_process_blocks_equal_one_call(artifacts_dir):
    """Block size does not change a ranking (the batched path is what the report measures)."""
    art = open_artifacts(artifacts_dir)
    inputs = bm.load_inputs(art, "test")
    from seeder.retrieve import registry

    retriever = registry.build("khop", art, art.config)
    whole, _ = bm.rank_blocks(retriever, inputs.subgraphs, inputs.query_features, 10_000)
    blocks, _ = bm.rank_blocks(retriever, inputs.subgraphs, inputs.query_features, 3)
    np.testing.assert_array_equal(whole.ranking, blocks.ranking)
    np.testing.assert_array_equal(whole.set_size, blocks.set_size)


@pytest.mark.e2e
def test_block_ranker_round_trip_in_shuffled_order(artifacts_dir):
    """The Ray UDF and the reassembly, without Ray: blocks returned out of order give the same results."""
    art = open_artifacts(artifacts_dir)
    inputs = bm.load_inputs(art, "test")
    from seeder.config import to_dict

    ranker = bm.BlockRanker(str(artifacts_dir), "test", ["dense", "ppr"], to_dict(art.config))
    ids = inputs.subgraphs.query_ids
    blocks = [ranker({"query_id": ids[lo : lo + 4]}) for lo in range(0, len(ids), 4)][::-1]
    got = bm.results_from_blocks(blocks, ["dense", "ppr"], ids)
    from seeder.retrieve import registry

    for name in ("dense", "ppr"):
        expected, _ = bm.rank_blocks(registry.build(name, art, art.config), inputs.subgraphs, inputs.query_features, 256)
        np.testing.assert_array_equal(got[name][0].ranking, expected.ranking)
        np.testing.assert_array_equal(got[name][0].set_size, expected.set_size)
    with pytest.raises(Exception, match="missing or repeated"):
        bm.results_from_blocks(blocks[1:], ["dense"], ids)


@pytest.mark.e2e
def test_report_directory_is_replaced_only_when_it_is_a_previous_report(tmp_path, capsys):
    from seeder.cli.main import main

    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("years of work")
    # Checked before the artifacts are opened or anything runs (the artifacts do not even exist here).
    assert (
        main(
            [
                "benchmark",
                "--artifacts",
                str(tmp_path / "missing"),
                "--method",
                "dense",
                "--experiment",
                "none",
                "--out",
                str(thesis),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        f"seeder benchmark: error: {thesis}: not a directory this tool wrote (it has no manifest.json of "
        f"kind seeder-dataset or seeder-artifacts, nor report.json), so it is left untouched rather than "
        f"replaced; remove it yourself or choose another --out"
    )
    assert [p.name for p in thesis.iterdir()] == ["chapter1.tex"]
    previous = tmp_path / "report"
    previous.mkdir()
    (previous / "report.json").write_text("{}")
    assert check_replaceable(previous, overwrite=True, marker=bm.REPORT_MARKER) is None
