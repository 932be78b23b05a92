"""tune/sweep.py end to end on tiny artifacts: a real `mlflow server`, the MLflow UI in headless
chromium, a failing trial, every listener on loopback, and a sweep interrupted with Ctrl-C, then killed with
-9, that resumes without rerunning finished trials."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from seeder.training.sweep import METRIC
from tests.processes import bench_kill, start_server, stop_session
from tests.sockets import assert_ray_listened_on_loopback_only, linux_only, needs_ss, watch_command

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "tune" / "sweep.py"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true")
# Tiny trials: a few queries per epoch, small models.
TRIAL_ARGS = [
    "--epochs",
    "2",
    "--queries-per-epoch",
    "24",
    "--val-queries",
    "16",
    "--num-cpus",
    "2",
    "train.num_trajectories=4",
    "train.batch_size=8",
    "train.expansion_sizes=[3,3]",
    "train.frontier_caps=[8,12]",
]
SPACE = """
model.hidden_dim: [8, 16]
model.num_layers: [1, 2]
model.dropout: null
# [30, 3] exceeds train.frontier_caps[0]: those trials raise a ConfigError in the trainer.
train.expansion_sizes: [[3, 3], [30, 3]]
"""

pytestmark = pytest.mark.slow


def write_tiny_graph(path: Path) -> Path:
    """300 named nodes, 4 relations, 1,500 random edges; 160 one-hop queries ("relation 2 of node 17"),
    112 train, 32 val, 16 test. Written by hand so that the test does not depend on `seeder synth`."""
    import numpy as np
    import pyarrow as pa

    from seeder.data.store import write_dataset

    rng = np.random.default_rng(0)
    n, r, e, q = 300, 4, 1500, 160
    src, dst, rel = rng.integers(0, n, e), rng.integers(0, n, e), rng.integers(0, r, e)
    names = [f"node {i}" for i in range(n)]
    nodes = pa.table({"id": np.arange(n), "type": ["entity"] * n, "name": names, "text": names})
    relations = pa.table(
        {
            "id": np.arange(r, dtype=np.int32),
            "name": [f"r{i}" for i in range(r)],
            "text": [f"relation {i}" for i in range(r)],
            "inverse_text": [f"inverse relation {i}" for i in range(r)],
        }
    )
    edges = pa.table({"src": src, "dst": dst, "relation": rel.astype(np.int32)})
    picked = rng.choice(e, q, replace=False)
    answers = [sorted(set(dst[(src == src[i]) & (rel == rel[i])].tolist())) for i in picked]
    splits = np.array(["train"] * 112 + ["val"] * 32 + ["test"] * 16)
    queries = pa.table(
        {
            "id": np.arange(q),
            "text": [f"relation {rel[i]} of node {src[i]}" for i in picked],
            "answers": answers,
            "split": splits.tolist(),
        }
    )
    return write_dataset(path, nodes, relations, edges, queries)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A tiny graph preprocessed by pipelines/preprocess.py with the hash encoder (in its own process: the graph is small)."""
    root = tmp_path_factory.mktemp("sweep-data")
    dataset = write_tiny_graph(root / "ds")
    out = root / "art"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "preprocess.py"),
            "--dataset",
            str(dataset),
            "--out",
            str(out),
            "--ray-address",
            "local",
            "embed.encoder=hash",
            "seed.strategy=dense",
            "expand.relation_score=cosine",
            "embed.hash_dim=32",
            "reduce.dim=16",
            "expand.budget=40",
            "expand.keep_per_hop=[15,25]",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


class Server(NamedTuple):
    url: str
    store: Path  # its sqlite file, which the tests read while a sweep writes to it


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on a free loopback port (sqlite store, served artifacts)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    proc, port = start_server(
        lambda port: [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],  # one process: under load, uvicorn's supervisor kills slow workers
        root / "server.log",
        cwd=root,
        env=dict(ENV, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),  # as `seeder ui`: no job-runner processes
    )
    try:
        yield Server(f"http://127.0.0.1:{port}", root / "mlflow.db")
    finally:
        stop_session(proc)


def sweep(args: list[str], cwd: Path, env: dict, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SWEEP), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def child_runs(store: Path, status: str | None = None, attempts: int = 1) -> dict[str, str]:
    """The sweep's trial runs in the server's store, name -> status (only ``status`` ones if given)."""
    for _ in range(attempts):
        if store.is_file():
            try:
                with sqlite3.connect(store, timeout=30) as con:
                    runs = dict(con.execute("select name, status from runs where name like 't0%'").fetchall())
                return {n: s for n, s in runs.items() if status in (None, s)}
            except sqlite3.OperationalError:  # not created yet, or locked by a writer
                pass
        time.sleep(1)
    return {}


class Interrupted(NamedTuple):
    first_log: str
    before: dict[str, str]  # trial run -> MLflow status just after Ctrl-C
    stamps: dict[str, int]  # finished trial -> its result.json's mtime then


@pytest.fixture(scope="module")
def server_sweep(artifacts, mlflow_server, tmp_path_factory):
    """The suite's one sweep, against the real server: 4 trials, one at a time, some failing by
    construction. Ctrl-C after two trials ended; a ``--resume`` killed with -9 inside a trial, nothing
    saved on the way out; a second ``--resume`` completes it. Returns (url, that last run, its sockets
    watched while it ran, what the interrupt left)."""
    root = tmp_path_factory.mktemp("sweep-server")
    (root / "space.yaml").write_text(SPACE)
    env = dict(ENV, MLFLOW_TRACKING_URI=mlflow_server.url)
    args = [
        "--artifacts",
        str(artifacts),
        "--num-samples",
        "4",
        "--max-concurrent",
        "1",
        "--space",
        str(root / "space.yaml"),
        "--name",
        "srv",
        "--storage",
        str(root / "ray"),
        # Seed 7 draws expansion sizes [30, 3] first, then good ones: a failed and a finished trial before
        # Ctrl-C, which lands in a trial that trains, and a last trial that trains too, for the kill.
        "--seed",
        "7",
        "--grace-epochs",
        "2",
        *TRIAL_ARGS,
    ]
    proc = subprocess.Popen(
        [sys.executable, str(SWEEP), *args], cwd=root, env=env, stdout=open(root / "first.log", "wb"), stderr=subprocess.STDOUT
    )
    # One trial at a time: once the third trial's directory exists, the first two have ended. Ctrl-C lands
    # 3 s later, inside the third trial or (when it failed at once) the fourth, so the sweep is still running.
    experiment_dir = root / "ray" / "srv"
    deadline = time.time() + 300
    while len(list(experiment_dir.glob("t[0-9]*"))) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before it could be interrupted: " + (root / "first.log").read_text()[-2000:]
    time.sleep(3)  # let Tune persist its experiment state (TUNE_GLOBAL_CHECKPOINT_S=2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, (root / "first.log").read_text()[-3000:]
    before = child_runs(mlflow_server.store, attempts=30)
    stamps = {
        p.parent.name: p.stat().st_mtime_ns
        for p in experiment_dir.glob("t*/result.json")
        if before.get(p.parent.name) == "FINISHED"
    }
    interrupted = Interrupted((root / "first.log").read_text(), before, stamps)

    # kill -9 the whole resumed sweep (its driver and embedded Ray) at a random point of a trial it runs.
    killed = subprocess.Popen(
        [sys.executable, str(SWEEP), *args, "--resume"],
        cwd=root,
        env=env,
        stdout=open(root / "killed.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # Inside a trial: the resumed sweep has reopened a trial's MLflow run (Ctrl-C left none RUNNING).
    deadline = time.time() + 300
    while not child_runs(mlflow_server.store, "RUNNING") and killed.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(random.Random(0).uniform(0.2, 1.5))
    assert killed.poll() is None, "the resumed sweep ended before the kill: " + (root / "killed.log").read_text()[-2000:]
    bench_kill.kill_group(killed)
    last, watch = watch_command([sys.executable, str(SWEEP), *args, "--resume"], timeout=400, cwd=root, env=env)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-5000:]
    return mlflow_server.url, last, watch, interrupted


@needs_ss
@linux_only
def test_the_sweep_listens_on_loopback_only(server_sweep):
    """Every listener of the sweep: its embedded Ray's, Tune's and the trials' (the MLflow server is the
    test's, not the sweep's)."""
    assert_ray_listened_on_loopback_only(server_sweep[2], "tune/sweep.py")


def test_sweep_logs_parent_child_runs_and_registers_the_champion(server_sweep, artifacts):
    from mlflow import MlflowClient

    from seeder import tracking

    url, proc, _, _ = server_sweep
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("seeder-sweeps")
    parents = client.search_runs([experiment.experiment_id], "tags.`seeder.kind` = 'sweep'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 4
    names = sorted(c.info.run_name for c in children)
    assert [n[:5] for n in names] == ["t000-", "t001-", "t002-", "t003-"]
    failed = [c for c in children if c.info.status == "FAILED"]
    ok = [c for c in children if c.info.status == "FINISHED"]
    # Exactly the trials given expansion sizes [30, 3] failed, and the sweep went on with the others.
    assert {c.info.run_id for c in failed} == {
        c.info.run_id for c in children if c.data.params["train.expansion_sizes"] == "[30, 3]"
    }
    assert failed and ok, "seed 7 should draw both expansion-size choices; pick another --seed if Optuna changed"
    assert all("frontier_caps" in c.data.tags["seeder.error"] for c in failed)
    for child in ok:
        history = client.get_metric_history(child.info.run_id, METRIC)
        # Two epochs, or one when ASHA stopped the trial at its first rung.
        epochs = 2 if child.data.tags["seeder.status"] == "FINISHED" else 1
        assert [m.step for m in history] == list(range(1, epochs + 1))
        logged = tracking.logged_model_of(client, child.info.run_id)  # the trial's best, an MLflow 3 logged model
        assert "MLmodel" in {f.path for f in client.list_logged_model_artifacts(logged.model_id)}
        assert {"data/model/seeder_model.json", "data/model/weights.pt"} <= {
            f.path for f in client.list_logged_model_artifacts(logged.model_id, "data/model")
        }
    # The champion: the best child by validation recall, registered with alias `champion`.
    version = client.get_model_version_by_alias(f"seeder-{artifacts.name}", "champion")
    best = max(ok, key=lambda c: max(m.value for m in client.get_metric_history(c.info.run_id, METRIC)))
    assert version.run_id == best.info.run_id == parent.data.tags["seeder.champion_run_id"]
    assert 0.0 <= parent.data.metrics["test_recall_at_20"] <= 1.0
    sweep_files = {f.path for f in client.list_artifacts(parent.info.run_id, "sweep")}
    assert {"sweep/results.csv", "sweep/results.md", "sweep/metric_vs_params.png"} <= sweep_files
    assert "| trial | status |" in proc.stdout


def test_champion_reproduces_its_logged_test_metrics(server_sweep, artifacts, tmp_path):
    from mlflow import MlflowClient

    url, _, _, _ = server_sweep
    client = MlflowClient(url)
    parent = client.search_runs([client.get_experiment_by_name("seeder-sweeps").experiment_id], "tags.`seeder.kind` = 'sweep'")[0]
    out = tmp_path / "test.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "seeder.cli",
            "evaluate",
            "--artifacts",
            str(artifacts),
            "--split",
            "test",
            "--method",
            "seeder",
            "--model",
            f"models:/seeder-{artifacts.name}@champion",
            "--json",
            str(out),
        ],
        env=dict(ENV, MLFLOW_TRACKING_URI=url),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    overall = json.loads(out.read_text())["methods"]["seeder"]["all"]
    for key in ("recall_at_20", "hit_at_1", "mrr"):
        assert overall[key] == pytest.approx(parent.data.metrics[f"test_{key}"], abs=1e-9)
    # The registered champion is an MLflow Model: the standard pyfunc loader ranks new questions with it.
    import mlflow
    import pandas as pd

    from seeder.data.store import open_dataset

    question = (
        open_dataset(json.loads((artifacts / "manifest.json").read_text())["dataset"])
        .queries_of("test")
        .column("text")[0]
        .as_py()
    )
    mlflow.set_tracking_uri(url)
    frame = mlflow.pyfunc.load_model(f"models:/seeder-{artifacts.name}@champion").predict(
        pd.DataFrame({"question": [question, "something else entirely"]}), params={"k": 5}
    )
    assert list(frame.columns) == ["question", "rank", "node", "name", "score", "step"]
    assert frame.groupby("question")["rank"].apply(list).to_dict() == {
        question: [1, 2, 3, 4, 5],
        "something else entirely": [1, 2, 3, 4, 5],
    }


def chromium_dom(url: str, profile: Path) -> str:
    proc = subprocess.run(
        [
            shutil.which("chromium"),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.stdout


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_mlflow_ui_lists_the_sweeps_runs(server_sweep, tmp_path):
    from mlflow import MlflowClient

    url, _, _, _ = server_sweep
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("seeder-sweeps").experiment_id
    parent = client.search_runs([experiment], "tags.`seeder.kind` = 'sweep'")[0]
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    # The runs table shows the sweep's parent run (its trials are nested under it) ...
    dom = chromium_dom(f"{url}/#/experiments/{experiment}/runs", tmp_path / "profile")
    assert parent.info.run_name in dom
    # ... and the comparison view lists every trial by name.
    ids = ",".join(f'"{c.info.run_id}"' for c in children)
    dom = chromium_dom(f'{url}/#/compare-runs?runs=[{ids}]&experiments=["{experiment}"]', tmp_path / "profile")
    missing = [c.info.run_name for c in children if c.info.run_name not in dom]
    assert not missing, f"the MLflow UI did not render runs {missing}"


def test_an_interrupted_and_then_killed_sweep_resumes_without_rerunning_finished_trials(server_sweep, mlflow_server):
    """Ctrl-C after two trials ended, then a ``--resume`` killed with -9 inside a trial: the second
    ``--resume`` completes the sweep and leaves the trials that had ended alone."""
    _, last, _, interrupted = server_sweep
    ended = {n for n, s in interrupted.before.items() if s in ("FINISHED", "FAILED")}
    assert 2 <= len(ended) < 4, interrupted.before
    # A trial that Tune will resume is KILLED in MLflow, not left RUNNING (or FINISHED when Ctrl-C fell
    # between its last epoch and Tune saving that result).
    assert set(interrupted.before.values()) <= {"FINISHED", "FAILED", "KILLED"}, interrupted.before
    assert "interrupted after" in interrupted.first_log
    assert interrupted.stamps and set(interrupted.stamps) == {n for n in ended if interrupted.before[n] == "FINISHED"}
    assert "resuming sweep srv" in last.stderr and "champion:" in last.stdout
    experiment_dir = Path(last.args[last.args.index("--storage") + 1]) / "srv"
    trial_dirs = sorted(p.name for p in experiment_dir.glob("t[0-9]*") if p.is_dir())
    assert len(trial_dirs) == 4, trial_dirs
    for name, stamp in interrupted.stamps.items():
        assert (experiment_dir / name / "result.json").stat().st_mtime_ns == stamp, f"finished trial {name} was rerun"
    runs = child_runs(mlflow_server.store)
    assert sorted(runs) == trial_dirs and set(runs.values()) <= {"FINISHED", "FAILED"}, runs
    assert {n: s for n, s in runs.items() if n in ended} == {n: interrupted.before[n] for n in ended}
    with sqlite3.connect(mlflow_server.store) as con:
        steps = con.execute(
            "select r.name, count(*), count(distinct m.step) from metrics m join runs r on r.run_uuid = m.run_uuid "
            f"where m.key = '{METRIC}' group by r.name"
        ).fetchall()
    assert all(total == distinct for _, total, distinct in steps), f"an epoch was logged twice: {steps}"


def test_a_sweep_killed_before_tunes_first_save_has_nothing_to_resume(tmp_path):
    """Tune writes its tuner at once and its experiment state a few seconds in: between the two, a
    directory can be restored by name but holds no state, and ``--resume`` starts the sweep over."""
    from tune.sweep import clear_experiment, tune_state_saved

    experiment = tmp_path / "s"
    (experiment / "trial_0").mkdir(parents=True)
    (experiment / "tuner.pkl").write_bytes(b"")
    assert not tune_state_saved(str(experiment))
    (experiment / "experiment_state-0.json").write_text("{}")
    assert tune_state_saved(str(experiment))
    clear_experiment(str(experiment))
    assert not experiment.exists() and not tune_state_saved(str(experiment))
    clear_experiment(str(experiment))  # nothing there: nothing to do
