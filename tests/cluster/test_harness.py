"""The multi-node harness itself: nodes that share no disk, S3 from every node, and a node lost for good.

One job runs a task on each worker node; each reports its node id, whether it sees the driver's files
(it must not), and an S3 round trip. Then worker ``a`` is killed hard: the GCS must declare it dead,
and a second job (after a replacement joins) must still run on ``b`` and on the new ``a``.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.harness import REPO

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


@pytest.mark.slow
def test_nodes_share_no_disk_reach_s3_and_survive_a_lost_node(s3_bucket, ray_cluster, tmp_path):
    start = time.monotonic()
    cluster, a, b = ray_cluster, ray_cluster.workers["a"], ray_cluster.workers["b"]
    assert len({cluster.head.node_id, a.node_id, b.node_id}) == 3

    markers = [cluster.driver_dir / "marker", tmp_path / "marker"]
    for marker in markers:
        marker.write_text("the driver's local file")
    job_dir = tmp_path / "job"  # the working dir, uploaded by Ray: not the repository
    job_dir.mkdir()
    (job_dir / "probe.py").write_text(JOB)
    env = {
        **s3_bucket.env,
        "SMOKE_URI": s3_bucket.uri("smoke"),
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
    fs = s3_bucket.filesystem()
    for node in (a, b):  # what the worker nodes wrote is visible from here
        with fs.open_input_stream(f"{s3_bucket.bucket}/smoke/one/{node.node_id}.txt") as stream:
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
