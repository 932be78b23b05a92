"""Fixtures shared across test modules."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]

if os.environ.get("SEEDER_TEST_QUICK"):
    # make test-quick: no Ray node may start, here or in any process a test starts (tests/without_ray).
    _WITHOUT_RAY = str(REPO / "tests" / "without_ray")
    sys.path.insert(0, _WITHOUT_RAY)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_WITHOUT_RAY, os.environ.get("PYTHONPATH")) if p)
ENV = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], str]) -> tuple[Path, str]:
    """``build(folder)`` once per test run, not once per pytest-xdist worker: under ``make test`` the first
    worker to ask builds it in the run's shared temp folder while the others wait on a lock, and each gets
    the folder and what ``build`` returned. What it builds is then read, never written, by the tests."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        return folder, build(folder)
    shared = tmp_path_factory.getbasetemp().parent
    folder, done = shared / name, shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, and by the kernel if this worker dies
        if not done.exists():  # written last: a worker that failed half-way leaves no result behind
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
        return folder, json.loads(done.read_text())


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """(root, MLflow run id): ``seeder synth`` -> pipelines/preprocess.py (hash encoder, entity linking,
    the learned filter with a prior that reads the questions' wording) -> ``python -m seeder.training.loop``
    for 4 epochs, logged to ``root/mlflow.db``; the model is ``root/run/model``. Built once per test run."""
    return once_per_run(tmp_path_factory, "trained", _train_the_shared_model)


def _train_the_shared_model(root: Path) -> str:
    seeder = str(Path(sys.executable).parent / "seeder")
    env = dict(ENV, MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}")
    done = run(
        [
            seeder,
            "synth",
            "--out",
            str(root / "syn"),
            "--nodes",
            "300",
            "--relations",
            "4",
            "--queries",
            "300",
            "--max-path-length",
            "1",
            "--hubs",
            "0",
            "--multi-answer-frac",
            "0",
        ],
        env=env,
    )
    assert done.returncode == 0, done.stderr
    done = run(
        [
            sys.executable,
            str(REPO / "pipelines" / "preprocess.py"),
            "--dataset",
            str(root / "syn"),
            "--out",
            str(root / "art"),
            "--ray-address",
            "local",
            "embed.encoder=hash",
            "embed.cpus_per_actor=1",
            "seed.strategy=dense+entity",
            "expand.relation_score=learned",
            "prior.epochs=5",
            "prior.min_count=1",
            "prior.hidden_dim=16",
            "prior.wording_dim=64",
            "reduce.dim=32",
            "expand.budget=60",
            "expand.keep_per_hop=[30,30]",
        ],
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done = run(
        [
            sys.executable,
            "-m",
            "seeder.training.loop",
            "--artifacts",
            str(root / "art"),
            "--out",
            str(root / "run"),
            "train.epochs=4",
            "train.warmup_epochs=1",
            "train.expansion_sizes=[5]",
            "train.frontier_caps=[20]",
            "model.hidden_dim=32",
            "train.lr=3e-3",
            "train.num_threads=1",
        ],
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("MLflow run ")[1].split(":")[0]


E2E_FOLDERS = ("pipelines", "tune", "cluster")
"""Test folders of the Ray entry points and the cluster: every test there is ``e2e``."""
SERVER_FIXTURES = {"s3_uri"}
"""Fixtures that start a server: a test that takes one, or runs with ``backend`` ``s3``, is ``e2e``."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if folder in E2E_FOLDERS or SERVER_FIXTURES & set(item.fixturenames) or params.get("backend") == "s3":
            item.add_marker(pytest.mark.e2e)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` hands whole files to its workers in collection order. Longest first (files with
        # slow tests, then the other end-to-end ones): a file of minutes handed out last would leave the
        # other worker idle that long while unit files, short, fill the end.
        def weight(item) -> int:
            return 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("e2e") else 2

        per_file: dict[str, int] = {}
        for item in items:
            per_file[item.fspath] = min(per_file.get(item.fspath, 2), weight(item))
        items.sort(key=lambda item: per_file[item.fspath])
