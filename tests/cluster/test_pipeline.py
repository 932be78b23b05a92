"""The README's cluster commands on a real multi-node Ray cluster whose nodes share no disk.

A head with no CPUs and two 1-CPU worker nodes, each in its own mount namespace where the driver's
files (pytest's temp dirs, the cluster's root) are an empty tmpfs (see harness.py). Storage is an S3
server. The first test checks the harness itself (no shared disk, S3 from every node, a lost node
replaced). Then every command goes through ``ray job submit`` with ``s3://`` locations, as on a cloud
cluster, and the tests check that both worker nodes did work, that the artifacts equal a one-node
run's file by file, and that losing a worker node costs time, not the result.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.train import SNAPSHOT_FILE
from seeder.policy.checkpoint import DESCRIPTION_FILE
from tests.cluster import harness
from tests.datasets import write_tiny_dataset

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Small shards, batches and blocks, so that a tiny graph still has work for both nodes in every stage.
PREPROCESS = [
    "--shard-rows",
    "50",
    "--udf-batch",
    "16",
    "--query-block",
    "5",
    "embed.batch_size=16",
    "embed.encoder=hash",
    "seed.strategy=dense",
    "expand.relation_score=learned",
    "prior.epochs=5",
    "prior.min_count=1",
    "prior.hidden_dim=16",
    "embed.hash_dim=64",
    "reduce.dim=16",
    "expand.budget=30",
    "expand.keep_per_hop=[12,18]",
]
TRAIN = [
    "train.batch_size=8",
    "train.num_trajectories=2",
    "train.expansion_sizes=[3,3]",
    "train.frontier_caps=[8,8]",
    "train.warmup_epochs=0",
    "model.hidden_dim=16",
    "model.num_layers=1",
    "train.eval_batch_size=64",
]
NOT_COMPARED = {"manifest.json", "summary.json"}  # they record times and nodes, which differ by run


def checksums(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in NOT_COMPARED
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "tiny", 60, seed=7, two_hop_answers=False, id_stride=7)


@pytest.fixture(scope="module")
def one_node_artifacts(dataset, tmp_path_factory) -> Path:
    """The same preprocessing on an embedded one-node Ray, with local paths: the reference. Run before
    the cluster starts, so that its clean-up of leftover local Ray processes never meets the cluster."""
    out = tmp_path_factory.mktemp("one-node") / "artifacts"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "preprocess.py"),
            "--dataset",
            str(dataset),
            "--out",
            str(out),
            "--ray-address",
            "local",
            "--num-cpus",
            "2",
            *PREPROCESS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=harness.base_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def s3():
    reason = harness.s3_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with harness.s3_server() as bucket:
        yield bucket


@pytest.fixture(scope="module")
def cluster(one_node_artifacts, request, tmp_path_factory):
    reason = harness.cluster_unavailable_reason()
    if reason:
        pytest.skip(f"multi-node Ray cluster: {reason}")
    failed_before = request.session.testsfailed
    # Worker nodes must not see pytest's temp dirs either: every tmp_path lives below this one.
    with harness.start_cluster(workers=("a", "b"), hidden=[tmp_path_factory.getbasetemp()]) as started:
        yield started
        if request.session.testsfailed > failed_before:
            started.keep_root = True


@pytest.fixture(scope="module")
def dataset_uri(dataset, s3) -> str:
    from seeder.system import storage

    uri = s3.uri("seeder/tiny/dataset")
    with _environment(s3.env):
        storage.publish(dataset, uri)
    return uri


class _environment:
    """Set environment variables for a block (the test process reads S3 with them)."""

    def __init__(self, values: dict[str, str]):
        self.values, self.saved = values, {}

    def __enter__(self):
        import os

        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc):
        import os

        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def job_env(cluster: harness.Cluster, s3: harness.S3Bucket) -> dict[str, str]:
    # SEEDER_CACHE lies under the cluster's root: the head's own folder there, a private tmpfs on
    # every worker node, so each node keeps its own cache.
    return {**s3.env, "SEEDER_CACHE": str(cluster.driver_dir / "cache")}


def fetched(uri: str, s3: harness.S3Bucket, cache: Path) -> Path:
    from seeder.system import storage

    with _environment({**s3.env, "SEEDER_CACHE": str(cache)}):
        return storage.fetch(uri)


def worker_ids(cluster: harness.Cluster) -> set[str]:
    return {node.node_id for node in cluster.workers.values()}


def stage_info(artifacts: Path, stage: str) -> dict:
    return json.loads((artifacts / stage / "manifest.json").read_text())["info"]


def preprocess(cluster, s3, dataset_uri: str, out_uri: str, wait: bool = True):
    return cluster.submit_job(
        ["python", "pipelines/preprocess.py", "--dataset", dataset_uri, "--out", out_uri, *PREPROCESS],
        env=job_env(cluster, s3),
        wait=wait,
        timeout=600,
    )


JOB = '''
"""Run a probe task on each worker node named on the command line; print RESULT {json}."""
import json, os, sys, time

import pyarrow.fs as pafs
import ray

import seeder  # the project is importable by the driver


@ray.remote(num_cpus=1)
def probe(phase, markers, uri):
    import seeder  # ... and on every worker node

    node_id = ray.get_runtime_context().get_node_id()
    fs, base = pafs.FileSystem.from_uri(uri)
    key = f"{base}/{phase}/{node_id}.txt"
    with fs.open_output_stream(key) as out:
        out.write(node_id.encode())
    with fs.open_input_stream(key) as back:
        echoed = back.read().decode()
    return {"node_id": node_id, "seeder": seeder.__file__, "sees": {m: os.path.exists(m) for m in markers},
            "s3": echoed == node_id, "env": os.environ.get("SMOKE_VALUE"), "cache": os.environ.get("SEEDER_CACHE")}


phase, dead, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
markers, uri = json.loads(os.environ["SMOKE_MARKERS"]), os.environ["SMOKE_URI"]
ray.init()
waited = None
if dead != "-":  # ray.nodes() must report the killed node dead
    start = time.monotonic()
    while time.monotonic() - start < 30:
        if any(n["NodeID"] == dead and not n["Alive"] for n in ray.nodes()):
            waited = time.monotonic() - start
            break
        time.sleep(0.2)
tasks = [probe.options(resources={f"node_{name}": 0.01}).remote(phase, markers, uri) for name in names]
result = {"driver": {"node_id": ray.get_runtime_context().get_node_id(),
                     "sees": {m: os.path.exists(m) for m in markers}},
          "dead_seen_after": waited, "tasks": dict(zip(names, ray.get(tasks, timeout=120)))}
print("RESULT " + json.dumps(result), flush=True)
'''


def _result(job) -> dict:
    assert job.ok, f"{job.status} {job.message}\n{job.logs[-4000:]}"
    found = job.lines_with("RESULT ")
    assert len(found) == 1, job.logs[-4000:]
    return json.loads(found[0])


def test_the_worker_nodes_share_no_disk_reach_s3_and_survive_a_lost_node(cluster, s3, tmp_path):
    """The harness itself, on the module's cluster before the pipeline runs on it: one job runs a task on
    each worker node; each reports its node id, whether it sees the driver's files (it must not), and an
    S3 round trip. Then worker ``a`` is killed hard: the GCS must declare it dead, and a second job (after
    a replacement joins) must still run on ``b`` and on the new ``a``."""
    start = time.monotonic()
    a, b = cluster.workers["a"], cluster.workers["b"]
    assert len({cluster.head.node_id, a.node_id, b.node_id}) == 3

    markers = [cluster.driver_dir / "marker", tmp_path / "marker"]
    for marker in markers:
        marker.write_text("the driver's local file")
    job_dir = tmp_path / "job"  # the working dir, uploaded by Ray: not the repository
    job_dir.mkdir()
    (job_dir / "probe.py").write_text(JOB)
    env = {
        **s3.env,
        "SMOKE_URI": s3.uri("smoke"),
        "SMOKE_VALUE": "passed through",
        "SMOKE_MARKERS": json.dumps([str(m) for m in markers]),
    }

    first = _result(cluster.submit_job(["python", "probe.py", "one", "-", "a,b"], working_dir=job_dir, env=env, timeout=120))
    assert first["driver"]["node_id"] == cluster.head.node_id  # a job's driver runs on the head
    assert all(first["driver"]["sees"].values()), first["driver"]
    for name, node in (("a", a), ("b", b)):
        task = first["tasks"][name]
        assert task["node_id"] == node.node_id, (name, task)
        assert not any(task["sees"].values()), f"worker {name} sees the driver's files: {task['sees']}"
        assert task["s3"] and task["env"] == "passed through", task
        assert task["cache"] == str(node.private / "cache"), task  # its own SEEDER_CACHE, not the driver's
        assert task["seeder"].startswith(str(REPO)), task  # the installed project, not a copy
    fs = s3.filesystem()
    for node in (a, b):  # what the worker nodes wrote is visible from here
        with fs.open_input_stream(f"{s3.bucket}/smoke/one/{node.node_id}.txt") as stream:
            assert stream.read().decode() == node.node_id

    killed = cluster.kill_worker("a")
    assert not killed.pids()
    took = cluster.wait_for_node_state(killed.node_id, "DEAD", timeout=30)
    replacement = cluster.add_worker("a")
    assert replacement.node_id != killed.node_id

    second = _result(
        cluster.submit_job(["python", "probe.py", "two", killed.node_id, "b,a"], working_dir=job_dir, env=env, timeout=120)
    )
    assert second["dead_seen_after"] is not None, "ray.nodes() never reported the killed node dead"
    assert second["tasks"]["b"]["node_id"] == b.node_id and second["tasks"]["b"]["s3"]
    assert second["tasks"]["a"]["node_id"] == replacement.node_id
    assert not any(second["tasks"]["a"]["sees"].values())
    print(f"dead after {took:.1f} s; test body {time.monotonic() - start:.1f} s")


def test_preprocessing_spreads_over_both_nodes_and_equals_one_node(cluster, s3, dataset_uri, one_node_artifacts, tmp_path):
    out_uri = s3.uri("seeder/tiny/artifacts")
    job = preprocess(cluster, s3, dataset_uri, out_uri)
    assert job.ok, f"{job.status} {job.message}\n{job.logs[-5000:]}"
    artifacts = fetched(out_uri, s3, tmp_path / "cache")
    assert checksums(artifacts) == checksums(one_node_artifacts)
    workers = worker_ids(cluster)
    texts = stage_info(artifacts, "embed")["texts_by_node"]
    assert set(texts) == workers, (texts, workers)
    rows = stage_info(artifacts, "features")["rows_by_node"]
    assert set(rows) == workers and sum(rows.values()) == 300, (rows, workers)
    for stage in ("seeds", "paths", "subgraphs"):
        blocks = stage_info(artifacts, stage)["blocks_by_node"]
        assert set(blocks) == workers, (stage, blocks, workers)
    subgraphs = stage_info(artifacts, "subgraphs")
    assert sorted(b for node in subgraphs["blocks_by_node"].values() for b in node) == list(range(subgraphs["blocks"]))
    names = {node.node_id: name for name, node in cluster.workers.items()}
    for stage, key in (
        ("embed", "texts_by_node"),
        ("features", "rows_by_node"),
        ("seeds", "blocks_by_node"),
        ("paths", "blocks_by_node"),
        ("subgraphs", "blocks_by_node"),
    ):
        work = {names[n]: (len(v) if isinstance(v, list) else v) for n, v in stage_info(artifacts, stage)[key].items()}
        print(f"{stage}: {key.split('_')[0]} per worker node {dict(sorted(work.items()))}")  # shown with pytest -s


def test_a_worker_node_lost_during_preprocessing_costs_time_not_the_result(
    cluster, s3, dataset_uri, one_node_artifacts, tmp_path
):
    import pyarrow.fs as pafs

    out_uri = s3.uri("seeder/tiny/artifacts-killed")
    job = preprocess(cluster, s3, dataset_uri, out_uri, wait=False)
    # The features stage is published just before the seeds and subgraphs stages send their blocks
    # to the nodes: kill node b then, while it starts its workers or runs their first blocks.
    features = f"{s3.bucket}/seeder/tiny/artifacts-killed/features/manifest.json"
    fs = s3.filesystem()
    deadline = time.monotonic() + 300
    while fs.get_file_info(features).type != pafs.FileType.File:
        assert time.monotonic() < deadline, cluster.job_logs(job.submission_id)[-3000:]
        time.sleep(0.1)
    lost = cluster.kill_worker("b")
    try:
        result = cluster.wait_job(job.submission_id, timeout=600)
        assert result.ok, f"{result.status} {result.message}\n{result.logs[-5000:]}"
        artifacts = fetched(out_uri, s3, tmp_path / "cache")
        assert checksums(artifacts) == checksums(one_node_artifacts)
        ran_on = set(stage_info(artifacts, "subgraphs")["blocks_by_node"])
        assert ran_on <= {lost.node_id, cluster.workers["a"].node_id}
    finally:
        cluster.add_worker("b")


@pytest.fixture(scope="module")
def cluster_artifacts(cluster, s3, dataset_uri) -> str:
    """Artifacts on S3 written by the cluster (``test_preprocessing_spreads_over_both_nodes_and_equals_one_node``
    writes the same, when it runs before)."""
    out_uri = s3.uri("seeder/tiny/artifacts")
    from seeder.system import storage

    with _environment(s3.env):
        if storage.published_manifest(out_uri) is None:
            job = preprocess(cluster, s3, dataset_uri, out_uri)
            assert job.ok, job.logs[-5000:]
    return out_uri


def train(cluster, s3, artifacts_uri: str, name: str, out: Path, *flags: str, epochs: int, wait: bool = True):
    return cluster.submit_job(
        [
            "python",
            "pipelines/train.py",
            "--artifacts",
            artifacts_uri,
            "--out",
            str(out),
            "--num-workers",
            "2",
            "--storage",
            s3.uri("seeder/tiny/ray"),
            "--name",
            name,
            "--no-mlflow",
            "--max-failures",
            "0",
            *flags,
            *TRAIN,
            f"train.epochs={epochs}",
        ],
        env=job_env(cluster, s3),
        wait=wait,
        timeout=600,
    )


RANK_LINE = re.compile(r"train: rank (\d) of 2 on node ([0-9a-f]+)")


def test_training_runs_one_worker_per_node_survives_a_lost_node_and_evaluates_from_s3(cluster, s3, cluster_artifacts):
    """One Ray Train worker per node; a node killed after the first checkpoint fails the run, and
    ``--resume`` (the node back) continues from the checkpoint in S3, again one worker per node, to a
    model that ``seeder evaluate`` loads on the cluster. One run for all three: a training job less."""
    out = cluster.driver_dir / "train-killed"
    job = train(cluster, s3, cluster_artifacts, "killed", out, epochs=8, wait=False)
    # Kill a node once Ray Train has recorded a checkpoint in S3 (its snapshot lists epoch_0001).
    import pyarrow.fs as pafs

    snapshot = f"{s3.bucket}/seeder/tiny/ray/killed/{SNAPSHOT_FILE}"
    fs = s3.filesystem()
    deadline = time.monotonic() + 300
    while not (fs.get_file_info(snapshot).type == pafs.FileType.File and b"epoch_0001" in fs.open_input_stream(snapshot).read()):
        assert time.monotonic() < deadline, cluster.job_logs(job.submission_id)[-3000:]
        time.sleep(0.2)
    cluster.kill_worker("b")
    try:
        failed = cluster.wait_job(job.submission_id, timeout=300)
        assert not failed.ok, failed.logs[-3000:]
    finally:
        cluster.add_worker("b")
    resumed = train(cluster, s3, cluster_artifacts, "killed", out, "--resume", epochs=8)
    assert resumed.ok, f"{resumed.status} {resumed.message}\n{resumed.logs[-5000:]}"
    ranks = dict(RANK_LINE.findall(resumed.logs))
    assert set(ranks) == {"0", "1"} and set(ranks.values()) == worker_ids(cluster), (ranks, worker_ids(cluster))
    assert re.search(r"resumed from checkpoint after epoch [1-7]", resumed.logs), resumed.logs[-3000:]
    assert "epoch 1/8" not in resumed.logs and "epoch 8/8" in resumed.logs
    history = json.loads((out / "history.json").read_text())
    assert [row["epoch"] for row in history] == list(range(1, 9))
    assert (out / "model" / DESCRIPTION_FILE).is_file()

    evaluated = cluster.submit_job(
        [
            "seeder",
            "evaluate",
            "--artifacts",
            cluster_artifacts,
            "--model",
            str(out / "model"),
            "--split",
            "test",
            "--method",
            "seeder",
        ],
        env=job_env(cluster, s3),
        timeout=300,
    )
    assert evaluated.ok, f"{evaluated.status} {evaluated.message}\n{evaluated.logs[-5000:]}"
    assert re.search(r"hit_at_1", evaluated.logs), evaluated.logs[-3000:]


# The sweep and the service log to, and load from, a real MLflow server: a node-local sqlite store
# cannot reach trials on other nodes (pipelines/ray_runtime.py refuses it there).
from tests.tune.test_sweep import mlflow_server  # noqa: E402,F401  (a module fixture: a real `mlflow server`)

SWEEP_SPACE = "model.hidden_dim: [8, 16]\nmodel.num_layers: [1]\nmodel.dropout: null\n"


@pytest.fixture(scope="module")
def champion(cluster, s3, cluster_artifacts, mlflow_server) -> tuple[str, str]:
    """A two-trial sweep on the cluster, one trial at a time on each worker node: (its champion's
    URI, the sweep's log)."""
    space = cluster.driver_dir / "space.yaml"
    space.write_text(SWEEP_SPACE)
    job = cluster.submit_job(
        [
            "python",
            "tune/sweep.py",
            "--artifacts",
            cluster_artifacts,
            "--num-samples",
            "2",
            "--max-concurrent",
            "2",
            "--space",
            str(space),
            "--name",
            "cluster",
            "--storage",
            s3.uri("seeder/tiny/sweeps"),
            "--epochs",
            "2",
            "--queries-per-epoch",
            "16",
            "--val-queries",
            "16",
            "--model-name",
            "seeder-cluster",
            "train.num_trajectories=2",
            "train.batch_size=8",
            "train.expansion_sizes=[3,3]",
            "train.frontier_caps=[8,8]",
        ],
        env={**job_env(cluster, s3), "MLFLOW_TRACKING_URI": mlflow_server.url},
        timeout=600,
    )
    assert job.ok, f"{job.status} {job.message}\n{job.logs[-5000:]}"
    return "models:/seeder-cluster@champion", job.logs


def test_a_sweep_runs_its_trials_on_both_nodes(cluster, champion):
    logs = champion[1]
    nodes = dict(re.findall(r"trial (\S+) ran on node ([0-9a-f]+)", logs))
    assert len(nodes) == 2 and set(nodes.values()) == worker_ids(cluster), (nodes, worker_ids(cluster))
    assert "champion:" in logs


def test_the_service_answers_from_a_replica_on_a_worker_node(cluster, s3, champion, mlflow_server):
    import urllib.parse
    import urllib.request

    from tests.conftest import free_port

    port = free_port()
    job = cluster.submit_job(
        ["seeder", "serve", "--model", champion[0], "--port", str(port), "--proxy-location", "HeadOnly"],
        env={**job_env(cluster, s3), "MLFLOW_TRACKING_URI": mlflow_server.url},
        wait=False,
    )
    url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"question": "what is related to node 7", "k": 5})
    deadline = time.monotonic() + 300
    reply = None
    try:
        while reply is None:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    reply = json.loads(response.read().decode())
            except OSError:
                info = cluster.job_info(job.submission_id)
                assert info["status"] in ("PENDING", "RUNNING"), cluster.job_logs(job.submission_id)[-5000:]
                assert time.monotonic() < deadline, cluster.job_logs(job.submission_id)[-5000:]
                time.sleep(1)
        assert len(reply["results"]) == 1 and reply["results"][0]["nodes"], reply
        actors = cluster._request("/api/v0/actors?limit=1000&detail=true&timeout=20")["data"]["result"]["result"]
        replicas = [a for a in actors if "SeederRetriever" in (a.get("class_name") or "") and a.get("state") == "ALIVE"]
        assert replicas and {a["node_id"] for a in replicas} <= worker_ids(cluster), replicas
    finally:
        cluster.stop_job(job.submission_id)
