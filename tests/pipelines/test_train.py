"""pipelines/train.py: a 2-worker Ray Train run with MLflow, resume after a killed run, bad input.

The artifacts are written by hand in the artifacts layout (no Ray, no encoder): a small
``seeder synth`` graph, random unit node features, each query's feature close to a neighbour of its
first answer (so dense seeds land one hop from an answer), dense seeds and K-HOP-WITH-FILTERING.
The Ray runs are subprocesses: each starts and stops its own embedded Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from seeder.config import SeederConfig, to_dict
from seeder.io import write_manifest
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.seeds import dense_seeds
from seeder.store import open_dataset
from seeder.synth import SynthConfig, synthesize

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pipelines" / "train.py"
TINY = ["train.epochs=3", "train.batch_size=8", "train.num_trajectories=2", "train.expansion_sizes=[3,3]",
        "train.frontier_caps=[8,8]", "train.warmup_epochs=0", "model.hidden_dim=16", "model.num_layers=1",
        "train.eval_batch_size=64"]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    synthesize(SynthConfig(nodes=300, relations=4, queries=160, hubs=0, val_fraction=0.2, test_fraction=0.1, seed=1),
               root / "kg")
    kg = open_dataset(root / "kg")
    rng = np.random.default_rng(0)
    dim = 16
    n, r = len(kg.nodes), len(kg.relations)
    queries = kg.queries
    ids = queries.column("id").to_numpy()
    answers = queries.column("answers").to_pylist()
    splits = np.array(queries.column("split").to_pylist(), dtype=object)
    nf = unit_rows(rng.standard_normal((n, dim)))
    rf = unit_rows(rng.standard_normal((2 * r, dim)))
    first = np.array([a[0] for a in answers])
    neighbour = np.asarray(kg.neighbors)[np.asarray(kg.indptr)[first]]  # synth nodes all have out-edges
    qf = unit_rows(nf[neighbour] + 0.3 * rng.standard_normal((len(ids), dim)))
    order = np.argsort(ids)
    ids, qf, splits, answers = ids[order], qf[order], splits[order], [answers[i] for i in order]

    config = SeederConfig()
    config.expand.budget, config.expand.keep_per_hop = 40, [15, 25]
    out = root / "artifacts"
    (out / "features").mkdir(parents=True)
    for name, array in (("node", nf), ("relation", rf), ("query", qf), ("query_ids", ids)):
        np.save(out / "features" / f"{name}.npy", array)
    write_manifest(out / "features", {"stage": "features"})
    seeds, scores = dense_seeds(qf, nf, config.seed.k0)
    answer_ptr = np.concatenate([[0], np.cumsum([len(a) for a in answers])])
    subgraphs = expand_queries(kg, nf, rf, qf, seeds, scores, config.expand, ids, splits, answer_ptr,
                               np.concatenate(answers).astype(np.int64))
    (out / "subgraphs").mkdir()
    pq.write_table(subgraphs.to_arrow(), out / "subgraphs" / "part-00000.parquet")
    write_manifest(out / "subgraphs", {"stage": "subgraphs"})
    write_manifest(out, {"dataset": str(root / "kg"), "config": to_dict(config)})
    return out


@pytest.fixture(scope="module")
def pipeline():
    """pipelines/train.py, imported as the installed module it also is."""
    from pipelines import train

    return train


def ray_started() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def run_train(args: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None, timeout: int = 400):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", RAY_ADDRESS="",
               RAY_AUTH_MODE="disabled", RAY_raylet_start_wait_time_s="180", **(extra_env or {}))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


def metric_history(tmp_path: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_two_workers_train_log_to_mlflow_and_evaluate(pipeline, artifacts, tmp_path, capsys):
    out = tmp_path / "run"
    proc = run_train(["--artifacts", str(artifacts), "--num-workers", "2", "--out", str(out), *TINY], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "epoch 3/3" in proc.stdout and "seeder ui" in proc.stdout

    history = json.loads((out / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert all(np.isfinite(row["loss"]) and 0.0 <= row["val_recall_at_20"] <= 1.0 for row in history)
    best_recall = max(row["val_recall_at_20"] for row in history)
    from seeder.train import load_checkpoint

    state = load_checkpoint(out / "best.pt")
    # The kept best.pt is an epoch with the best validation recall; among tied epochs (frequent on this
    # tiny set), the one with the best MRR.
    best_row = history[state.epoch - 1]
    assert best_row["val_recall_at_20"] == pytest.approx(best_recall)
    tied = [row for row in history if row["val_recall_at_20"] == pytest.approx(best_recall)]
    assert best_row["val_mrr"] == pytest.approx(max(row["val_mrr"] for row in tied))
    assert state.best_metric == pytest.approx(best_row["val_recall_at_20"] + 1e-3 * best_row["val_mrr"])
    assert (out / "config.yaml").is_file() and (out / "training_curve.png").stat().st_size > 1000
    # Each of the two workers trains on its half of the trainable queries: the schedule counts its steps.
    from seeder.artifacts import open_artifacts
    from seeder.train import TrainingData, trainable_queries

    trainable = len(trainable_queries(TrainingData.from_artifacts(open_artifacts(artifacts), "train"), state.config))
    assert state.steps_per_epoch == -(-(trainable // 2) // 8)

    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "3" and run.data.params["run.num_workers"] == "2"
    for key in ("loss", "rl_loss", "bpr_loss", "mean_reward", "val_hit_at_1", "val_hit_at_5", "val_mrr",
                "val_recall_at_20", "trajectories_per_second"):
        assert [step for step, _ in metric_history(tmp_path, run_id, key)] == [1, 2, 3], key
    assert metric_history(tmp_path, run_id, "loss") == [(r["epoch"], pytest.approx(r["loss"])) for r in history]
    artifacts_logged = {a.path for a in client.list_artifacts(run_id, "model")}
    assert artifacts_logged == {"model/best.pt", "model/config.yaml"}
    assert "training_curve.png" in {a.path for a in client.list_artifacts(run_id)}

    # The best checkpoint serves retrieval through the evaluation command.
    report = tmp_path / "eval.json"
    from seeder.cli import main

    assert main(["evaluate", "--artifacts", str(artifacts), "--method", "seeder", "--model", str(out / "best.pt"),
                 "--split", "val", "--json", str(report)]) == 0
    assert report.is_file()

    # A second run into the same directory without --resume is refused before Ray starts.
    capsys.readouterr()
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(out), *TINY]) == 2
    assert "--resume" in capsys.readouterr().err and not ray_started()


@pytest.mark.slow
def test_killed_run_resumes_from_its_checkpoint(artifacts, tmp_path):
    out = tmp_path / "run"
    args = ["--artifacts", str(artifacts), "--num-workers", "2", "--out", str(out), "--max-failures", "0", *TINY]
    killed = run_train(args, tmp_path, extra_env={"SEEDER_TRAIN_EXIT_AFTER_EPOCH": "1"})
    assert killed.returncode == 1, killed.stdout[-3000:] + killed.stderr[-5000:]
    assert "epoch 1/3" in killed.stdout and "epoch 2/3" not in killed.stdout
    assert not (out / "best.pt").exists()

    resumed = run_train([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert "resumed from checkpoint after epoch 1" in resumed.stdout
    assert "epoch 1/3" not in resumed.stdout and "epoch 3/3" in resumed.stdout
    history = json.loads((out / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2, 3]
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    assert [step for step, _ in metric_history(tmp_path, run_id, "loss")] == [1, 2, 3]  # one run, all epochs


def test_missing_artifacts_is_a_clear_error_before_ray(pipeline, tmp_path, capsys):
    assert pipeline.main(["--artifacts", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "preprocess" in err
    assert not ray_started() and not (tmp_path / "run").exists()


def test_missing_val_split_is_a_clear_error_before_ray(pipeline, artifacts, tmp_path, capsys):
    broken = tmp_path / "artifacts"
    shutil.copytree(artifacts, broken)
    table = pq.read_table(broken / "subgraphs" / "part-00000.parquet")
    keep = np.array(table.column("split").to_pylist()) != "val"
    pq.write_table(table.filter(keep), broken / "subgraphs" / "part-00000.parquet")
    assert pipeline.main(["--artifacts", str(broken), "--out", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "'val'" in err and str(broken) in err
    assert not ray_started()


@pytest.mark.parametrize(
    "override, expected",
    [("train.epochs=abc", "train.epochs"), ("train.no_such_field=1", "no_such_field"),
     ("train.expansion_sizes=[3]", "expansion_sizes"), ("train.baseline=median", "median")],
)
def test_bad_override_is_a_clear_error_before_ray(pipeline, artifacts, tmp_path, capsys, override, expected):
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), override]) == 2
    err = capsys.readouterr().err
    assert expected in err and "error" in err
    assert not ray_started() and not (tmp_path / "run").exists()


def test_more_workers_than_queries_is_refused(pipeline, artifacts, tmp_path, capsys):
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), "--num-workers", "4",
                          "train.queries_per_epoch=3"]) == 2
    assert "--num-workers" in capsys.readouterr().err
    assert not ray_started()


def test_relative_init_from_reaches_workers_as_an_absolute_path(pipeline, artifacts, tmp_path, monkeypatch, capsys):
    # Ray Train workers run in their own directories: a path relative to the driver's must be resolved.
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "best.pt").write_bytes(b"weights")
    monkeypatch.chdir(tmp_path)
    job = pipeline.prepare_job(str(artifacts), None, [*TINY, "train.init_from=older/best.pt"], str(tmp_path / "run"), 2)
    assert job.config.train.init_from == str(tmp_path / "older" / "best.pt")
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), *TINY,
                          "train.init_from=older/missing.pt"]) == 2
    err = capsys.readouterr().err
    assert "older/missing.pt" in err and "checkpoint" in err
    assert not ray_started() and not (tmp_path / "run").exists()


def test_epoch_shards_are_disjoint_equal_and_reseeded_per_epoch(pipeline):
    epoch_shard = pipeline.epoch_shard
    pool = np.arange(100, 203)
    shards = [epoch_shard(pool, 0, 0, rank, 4) for rank in range(4)]
    assert {len(s) for s in shards} == {25}  # 103 // 4: every rank takes the same number of steps
    joined = np.concatenate(shards)
    assert len(np.unique(joined)) == 100 and np.isin(joined, pool).all()
    assert not np.array_equal(epoch_shard(pool, 0, 1, 0, 4), shards[0])
    assert np.array_equal(epoch_shard(pool, 0, 0, 2, 4), shards[2])
    assert len(epoch_shard(pool, 0, 0, 1, 4, queries_per_epoch=40)) == 10
