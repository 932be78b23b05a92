"""pipelines/train.py: a 2-worker Ray Train run with MLflow, stopped after an epoch and resumed, bad input.

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
from seeder.data.store import open_dataset
from seeder.generate.synth import SynthConfig, synthesize
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.seeds import dense_seeds
from seeder.system.io import DataError, write_manifest
from tests.sockets import Watch, assert_ray_listened_on_loopback_only, linux_only, needs_ss, watch_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pipelines" / "train.py"
TINY = [
    "train.epochs=3",
    "train.batch_size=8",
    "train.num_trajectories=2",
    "train.expansion_sizes=[3,3]",
    "train.frontier_caps=[8,8]",
    "train.warmup_epochs=0",
    "model.hidden_dim=16",
    "model.num_layers=1",
    "train.eval_batch_size=64",
]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    synthesize(SynthConfig(nodes=300, relations=4, queries=160, hubs=0, val_fraction=0.2, test_fraction=0.1, seed=1), root / "kg")
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
    subgraphs = expand_queries(
        kg, nf, rf, qf, seeds, scores, config.expand, ids, splits, answer_ptr, np.concatenate(answers).astype(np.int64)
    )
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


def train_env(tmp_path: Path, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    return dict(
        os.environ,
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        RAY_ADDRESS="",
        RAY_AUTH_MODE="disabled",
        RAY_raylet_start_wait_time_s="180",
        **(extra_env or {}),
    )


def run_train(args: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None, timeout: int = 400):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        env=train_env(tmp_path, extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def two_workers(
    artifacts, tmp_path_factory
) -> tuple[Path, subprocess.CompletedProcess, Watch, subprocess.CompletedProcess, bool]:
    """A two-worker run of TINY stopped after its first epoch, then resumed with ``--resume`` while another
    Ray runs on the machine, in the folder returned (with its MLflow store): (folder, the resumed run, its
    listening sockets watched while it ran, the stopped run, whether the stopped run left a model
    directory). The tests read the resumed run as a finished one: resuming must leave the same model
    directory, history and one MLflow run as an uninterrupted run would. (The Ray-free loop and a
    one-worker Ray Train run agree: tests/test_faults.py, on its reference run.)"""
    from tests.pipelines.test_ray_runtime import DRIVER, driver_env, wait_ready
    from tests.processes import stop_gracefully

    tmp_path = tmp_path_factory.mktemp("two-workers")
    args = ["--artifacts", str(artifacts), "--num-workers", "2", "--out", str(tmp_path / "run"), "--max-failures", "0", *TINY]
    # The other Ray's driver starts beside the stopped run, and is up before the resumed one starts.
    other = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "hold"],
        cwd=REPO,
        env=driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        stopped = run_train(args, tmp_path, extra_env={"SEEDER_TRAIN_EXIT_AFTER_EPOCH": "1"})
        left_a_model = (tmp_path / "run" / "model").exists()
        wait_ready(other)
        proc, watch = watch_command(
            [sys.executable, str(SCRIPT), *args, "--resume"], timeout=400, env=train_env(tmp_path), cwd=tmp_path
        )
    finally:
        stop_gracefully(other)
    return tmp_path, proc, watch, stopped, left_a_model


def metric_history(tmp_path: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_two_workers_train_log_to_mlflow_and_evaluate(pipeline, artifacts, two_workers, capsys):
    tmp_path, proc, _, _, _ = two_workers
    out = tmp_path / "run"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "epoch 3/3" in proc.stdout and "seeder ui" in proc.stdout
    # Ray's placement-group cleaner polls the State API, which needs the dashboard the embedded Ray runs
    # without; its warning every few seconds is silenced in every worker (pipelines.ray_runtime).
    assert "Failed to query Ray Train Controller" not in proc.stdout + proc.stderr
    # Each epoch line once (Ray Train's print patch would send it twice); Ray Train's INFO lines and the
    # MLflow store's set-up notices stay out of the terminal, and the log folder is named instead.
    assert [line for line in proc.stdout.splitlines() if "epoch 3/3  loss" in line].__len__() == 1
    for routine in ("Reporting training result", "Setting up process group", "Creating initial MLflow database"):
        assert routine not in proc.stdout + proc.stderr, routine
    assert "Ray's logs are in" in proc.stderr

    history = json.loads((out / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert all(np.isfinite(row["loss"]) and 0.0 <= row["val_recall_at_20"] <= 1.0 for row in history)
    best_recall = max(row["val_recall_at_20"] for row in history)
    from seeder.policy import checkpoint
    from seeder.training.loop import load_state

    _, info = checkpoint.load_model(out / "model")
    # The kept model is an epoch with the best validation recall; among tied epochs (frequent on this
    # tiny set), the one with the best MRR.
    best_row = history[info.epoch - 1]
    assert best_row["val_recall_at_20"] == pytest.approx(best_recall)
    tied = [row for row in history if row["val_recall_at_20"] == pytest.approx(best_recall)]
    assert best_row["val_mrr"] == pytest.approx(max(row["val_mrr"] for row in tied))
    assert info.metrics["val_mrr"] == pytest.approx(best_row["val_mrr"])
    assert (out / "training_curve.png").stat().st_size > 1000
    # Each of the two workers trains on its half of the trainable queries: the schedule counts its steps.
    from seeder.policy.inference import QueryData
    from seeder.preprocessing.artifacts import open_artifacts
    from seeder.training.loop import trainable_queries

    last = load_state(max((out / "ray" / "train").glob("epoch_*")) / pipeline.CHECKPOINT_DIR)
    assert last.epoch == 3 and last.best_epoch == info.epoch
    trainable = len(trainable_queries(QueryData.from_artifacts(open_artifacts(artifacts), "train"), last.config))
    assert last.steps_per_epoch == -(-(trainable // 2) // 8)

    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    from mlflow import MlflowClient

    from seeder import tracking

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "3" and run.data.params["run.num_workers"] == "2"
    for key in (
        "loss",
        "loss_reinforce",
        "loss_bpr",
        "reward",
        "val_hit_at_1",
        "val_hit_at_5",
        "val_mrr",
        "val_recall_at_20",
        "selection_score",
        "trajectories_per_second",
    ):
        assert [step for step, _ in metric_history(tmp_path, run_id, key)] == [1, 2, 3], key
    assert metric_history(tmp_path, run_id, "loss") == [(r["epoch"], pytest.approx(r["loss"])) for r in history]
    logged = tracking.logged_model_of(client, run_id)  # the best model, an MLflow 3 logged model of the run
    assert {"MLmodel", "data"} <= {a.path for a in client.list_logged_model_artifacts(logged.model_id)}
    assert {"data/model/seeder_model.json", "data/model/weights.pt"} <= {
        a.path for a in client.list_logged_model_artifacts(logged.model_id, "data/model")
    }
    assert "val_recall_at_20" in {m.key for m in logged.metrics}  # the metrics of its epoch, linked
    assert "training_curve.png" in {a.path for a in client.list_artifacts(run_id)}

    # The best model serves retrieval through the evaluation command, from the run directory and from MLflow.
    from seeder.cli.main import main

    for model in (str(out / "model"), f"runs:/{run_id}/model"):
        report = tmp_path / "eval.json"
        report.unlink(missing_ok=True)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
        try:
            assert (
                main(
                    [
                        "evaluate",
                        "--artifacts",
                        str(artifacts),
                        "--method",
                        "seeder",
                        "--model",
                        model,
                        "--split",
                        "val",
                        "--json",
                        str(report),
                    ]
                )
                == 0
            )
        finally:
            os.environ.pop("MLFLOW_TRACKING_URI")
        assert report.is_file()

    # A second run into the same directory without --resume is refused before Ray starts.
    capsys.readouterr()
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(out), *TINY]) == 2
    assert "--resume" in capsys.readouterr().err and not ray_started()


@pytest.mark.slow
@needs_ss
@linux_only
def test_two_workers_listen_on_loopback_only(two_workers):
    """Every listener of the run: its embedded Ray's, Ray Train's workers', gloo's and torch's
    rendezvous store."""
    _, proc, watch, _, _ = two_workers
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert_ray_listened_on_loopback_only(watch, "pipelines/train.py --num-workers 2")


@pytest.mark.slow
def test_a_stopped_run_resumes_from_its_checkpoint(two_workers):
    tmp_path, resumed, _, stopped, left_a_model = two_workers
    assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-5000:]
    assert "epoch 1/3" in stopped.stdout and "epoch 2/3" not in stopped.stdout
    assert not left_a_model
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert "resumed from checkpoint after epoch 1" in resumed.stdout
    assert "epoch 1/3" not in resumed.stdout and "epoch 3/3" in resumed.stdout
    # One MLflow run for both (test_two_workers_train_log_to_mlflow_and_evaluate checks its three epochs).
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"] in stopped.stdout


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
    [
        ("train.epochs=abc", "train.epochs"),
        ("train.no_such_field=1", "no_such_field"),
        ("train.expansion_sizes=[3]", "expansion_sizes"),
        ("train.baseline=median", "median"),
    ],
)
def test_bad_override_is_a_clear_error_before_ray(pipeline, artifacts, tmp_path, capsys, override, expected):
    assert pipeline.main(["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), override]) == 2
    err = capsys.readouterr().err
    assert expected in err and "error" in err
    assert not ray_started() and not (tmp_path / "run").exists()


def test_more_workers_than_queries_is_refused(pipeline, artifacts, tmp_path, capsys):
    assert (
        pipeline.main(
            ["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), "--num-workers", "4", "train.queries_per_epoch=3"]
        )
        == 2
    )
    assert "--num-workers" in capsys.readouterr().err
    assert not ray_started()


def test_relative_init_from_reaches_workers_as_an_absolute_path(pipeline, artifacts, tmp_path, monkeypatch, capsys):
    # Ray Train workers run in their own directories: a path relative to the driver's must be resolved.
    (tmp_path / "older" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    job = pipeline.prepare_job(str(artifacts), None, [*TINY, "train.init_from=older/model"], str(tmp_path / "run"), 2)
    assert job.config.train.init_from == str(tmp_path / "older" / "model")
    assert (
        pipeline.main(["--artifacts", str(artifacts), "--out", str(tmp_path / "run"), *TINY, "train.init_from=older/missing"])
        == 2
    )
    err = capsys.readouterr().err
    assert "older/missing" in err and "model directory" in err
    assert not ray_started() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_another_ray_on_the_machine_leaves_the_terminal_clean(two_workers):
    """Ray Train's placement-group cleaner asks Ray's State API for "the" local cluster; with a second Ray
    running (the resumed run has one beside it) it printed a ConnectionError traceback every few seconds
    (issue 15)."""
    _, proc, _, _, _ = two_workers
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "epoch 3/3  loss" in proc.stdout
    terminal = proc.stdout + proc.stderr
    assert "Traceback" not in terminal and "multiple active Ray instances" not in terminal, terminal[-3000:]


def test_a_local_ray_that_cannot_place_the_workers_is_an_error_not_a_wait():
    from pipelines.train import local_shortfall

    one_gpu = {"CPU": 16.0, "GPU": 1.0}
    assert local_shortfall(one_gpu, 1, True, 4) is None
    assert "pass --num-workers 1" in local_shortfall(one_gpu, 2, True, 1)  # the default of 2 workers on one GPU
    assert "no GPU" in local_shortfall({"CPU": 2.0}, 1, True, 1)
    assert local_shortfall({"CPU": 2.0}, 2, False, 1) is None
    assert "lower --num-workers" in local_shortfall({"CPU": 2.0}, 2, False, 1.5)


def _hook_rank(rank: int, world: int, store_path: str, delayed: bool, grads: np.ndarray, out: str) -> None:
    """One rank of the gradient-average test: a 3-weight model stepped with plain SGD (lr 1) on given
    gradients, through the optimiser hook; writes the weights after every step."""
    import torch
    import torch.distributed as dist

    from pipelines.train import GradientAverage

    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    average = GradientAverage(model, world, delayed)
    optimizer.register_step_pre_hook(average)
    weights = []
    for step in range(len(grads[rank])):
        model.weight.grad = torch.tensor(grads[rank][step], dtype=torch.float32).view(1, 3)
        optimizer.step()
        weights.append(model.weight.detach().view(-1).numpy().copy())
    average.finish()
    np.save(out, np.stack(weights))
    # Once both ranks are past their last all-reduce, exit without tearing gloo down: its destructor
    # aborted now and then ("terminate called without an active exception"), which is not under test.
    store.set(f"done{rank}", "1")
    store.wait([f"done{r}" for r in range(world)])
    os._exit(0)


@pytest.mark.parametrize("delayed", [False, True], ids=["exact", "delayed"])
def test_gradients_are_averaged_over_ranks_now_or_one_step_late(tmp_path, delayed):
    """train.delayed_allreduce: step t applies the ranks' mean gradient of step t (exact) or of step t-1
    (delayed; the first step changes nothing), and the ranks' weights stay identical."""
    import torch.multiprocessing as mp

    world, steps = 2, 4
    grads = np.random.default_rng(0).standard_normal((world, steps, 3)).round(2)
    outs = [str(tmp_path / f"rank{r}.npy") for r in range(world)]
    processes = [
        mp.get_context("spawn").Process(target=_hook_rank, args=(r, world, str(tmp_path / "store"), delayed, grads, outs[r]))
        for r in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
        assert p.exitcode == 0
    weights = [np.load(o) for o in outs]
    np.testing.assert_array_equal(weights[0], weights[1])
    applied = np.cumsum(grads.mean(axis=0), axis=0)  # the SGD sum of the mean gradients up to each step
    if delayed:
        applied = np.vstack([np.zeros((1, 3)), applied[:-1]])
    np.testing.assert_allclose(weights[0], -applied, atol=1e-6)


def test_several_artifacts_train_one_model_only_in_one_feature_space(tmp_path):
    """Several --artifacts: one job over every graph's questions, the most steps any graph's derived
    budget asks for, and a clear error when the graphs' features are not in one space."""
    import pipelines.train as pipeline
    from tests.datasets import hand_built_artifacts

    first, _, _ = hand_built_artifacts(
        tmp_path / "a", "dense", relations=3, reduce_dim=0, step_budget={"expansion_sizes": [5, 5], "frontier_caps": [25, 25]}
    )
    second, _, _ = hand_built_artifacts(
        tmp_path / "b",
        "dense",
        relations=5,
        reduce_dim=0,
        seed=4,
        step_budget={"expansion_sizes": [4, 9, 6], "frontier_caps": [20, 45, 30]},
    )
    one = pipeline.prepare_job([str(first)], None, ["train.epochs=1"], str(tmp_path / "one"), 1)
    both = pipeline.prepare_job([str(first), str(second)], None, ["train.epochs=1"], str(tmp_path / "both"), 1)
    assert both.artifacts == f"{first},{second}"
    assert both.val_queries == 2 * one.val_queries == 16 and both.trainable >= one.trainable
    assert both.config.train.expansion_sizes == [5, 9, 6] and both.config.train.frontier_caps == [25, 45, 30]
    pca, _, _ = hand_built_artifacts(tmp_path / "pca", "dense", relations=5, seed=4)
    with pytest.raises(DataError, match="one feature space; build each with reduce.dim=0"):
        pipeline.prepare_job([str(first), str(pca)], None, [], str(tmp_path / "mixed"), 1)
