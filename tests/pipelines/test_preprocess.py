"""pipelines/preprocess.py end to end on a tiny graph with the hash encoder: artifacts, skipping,
resuming after a kill, clear errors, a run through `ray job submit`, and every listener on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seeder.config import load_config
from seeder.data.store import open_dataset
from seeder.features import bfloat16
from seeder.preprocessing.artifacts import open_artifacts
from seeder.preprocessing.stages import TEST_STOP_ENV, stage_fingerprints
from seeder.system.io import DataError
from tests.conftest import free_port
from tests.datasets import write_tiny_dataset
from tests.sockets import Watch, assert_ray_listened_on_loopback_only, linux_only, needs_ss, watch_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pipelines" / "preprocess.py"
# Small shards and blocks so that a tiny graph still has several of each (resume granularity).
FLAGS = ["--shard-rows", "100", "--query-block", "10"]
OVERRIDES = [
    "embed.encoder=hash",
    "seed.strategy=dense",
    "expand.relation_score=cosine",
    "embed.hash_dim=64",
    "reduce.dim=16",
    "expand.budget=30",
    "expand.keep_per_hop=[12,18]",
]
STAGE_NAMES = ("embed", "features", "seeds", "subgraphs")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop(TEST_STOP_ENV, None)
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def job_command(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--dataset",
        str(dataset),
        "--out",
        str(out),
        "--ray-address",
        "local",
        "--num-cpus",
        "2",
        *FLAGS,
        *OVERRIDES,
        *extra,
    ]


def run_job(dataset: Path, out: Path, *extra: str, env: dict[str, str] | None = None, timeout: int = 600):
    return subprocess.run(
        job_command(dataset, out, *extra), capture_output=True, text=True, env=env or _env(), timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> Path:
    """300 nodes, 1,500 edges, 4 relations, 40 queries over three splits with a ``hop`` attribute."""
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "tiny", 40, seed=7, two_hop_answers=False, id_stride=7)


ON_RAY = ["--in-process-below", "0"]
"""A tiny graph goes through every stage in the driver unless told otherwise: the reference runs on Ray,
so that the runs of the other tests (in the driver) are compared with it."""


@pytest.fixture(scope="module")
def reference_run(tiny_dataset, tmp_path_factory) -> tuple[Path, Watch]:
    """The reference job on Ray, with its process tree's listening sockets watched while it runs."""
    out = tmp_path_factory.mktemp("art") / "reference"
    result, watch = watch_command(job_command(tiny_dataset, out, *ON_RAY), timeout=600, env=_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (out.parent / "terminal.txt").write_text(result.stdout + result.stderr)
    return out, watch


@pytest.fixture(scope="module")
def reference(reference_run) -> Path:
    return reference_run[0]


@needs_ss
@linux_only
def test_the_job_listens_on_loopback_only(reference_run):
    """Every listener of the job's embedded Ray, its Ray Data workers included."""
    assert_ray_listened_on_loopback_only(reference_run[1], "pipelines/preprocess.py")


def test_the_terminal_shows_the_stages_not_rays_routine_notices(reference):
    terminal = (reference.parent / "terminal.txt").read_text()
    assert "embed: " in terminal and "subgraphs: " in terminal and "Ray's logs are in" in terminal
    for routine in (
        "Token authentication is enabled",
        "Progress bars disabled",
        "Starting execution of Dataset",
        "Started a local Ray instance",
        "Loading weights",
    ):
        assert routine not in terminal, routine


def _assert_same_artifacts(a: Path, b: Path) -> None:
    x, y = open_artifacts(a), open_artifacts(b)
    for name in ("node_features", "relation_features", "query_features", "query_ids"):
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    for left, right in zip(x.seeds(), y.seeds()):
        np.testing.assert_array_equal(left, right)
    sx, sy = x.subgraphs(), y.subgraphs()
    assert len(np.unique(sy.query_ids)) == len(sy.query_ids) == len(x.query_ids)
    assert sx.equals(sy)


def test_job_writes_every_artifact(reference, tiny_dataset):
    art = open_artifacts(reference)
    kg = open_dataset(tiny_dataset)
    assert art.node_features.shape == (300, 16) and art.relation_features.shape == (8, 16)
    assert art.query_features.shape == (40, 16)
    np.testing.assert_allclose(np.linalg.norm(art.node_features, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(art.query_ids, np.sort(kg.queries.column("id").to_numpy()))
    # Features of a query are its text's hash embedding, PCA-projected: check one by hand.
    from seeder.features.embed import PCA, HashEncoder, apply_pca

    pca = PCA.load(reference / "features" / "pca.npz")
    texts = dict(zip(kg.queries.column("id").to_pylist(), kg.queries.column("text").to_pylist()))
    expected = apply_pca(HashEncoder(dim=64).encode([texts[int(art.query_ids[5])]]), pca)
    np.testing.assert_allclose(art.query_features[5], expected[0], atol=1e-5)

    query_ids, seeds, scores = art.seeds()
    assert seeds.shape == (40, 3) and (seeds >= 0).all()
    np.testing.assert_allclose(scores[:, 0], np.max(art.query_features @ art.node_features.T, axis=1), atol=1e-5)

    subgraphs = art.subgraphs()
    np.testing.assert_array_equal(subgraphs.query_ids, art.query_ids)
    assert (subgraphs.sizes <= 30).all() and (subgraphs.sizes > 3).all()
    assert set(subgraphs.splits.tolist()) == {"train", "val", "test"}
    assert len(art.subgraphs("val")) == 13

    summary = json.loads((reference / "summary.json").read_text())
    assert set(summary["stages"]) == set(STAGE_NAMES)
    assert summary["stages"]["embed"]["items"] == 300 + 8 + 40
    hit = float(np.mean(np.bincount(np.repeat(np.arange(40), subgraphs.sizes)[subgraphs.is_answer], minlength=40) > 0))
    assert summary["ceiling"]["all"]["all"]["hit_any"] == pytest.approx(hit)
    assert {"hop=1", "hop=2"} <= set(summary["ceiling"]["test"])
    manifest = json.loads((reference / "manifest.json").read_text())
    assert manifest["fingerprints"] == stage_fingerprints(
        load_config(None, OVERRIDES), open_dataset(tiny_dataset).fingerprint, open_dataset(tiny_dataset).num_nodes
    )


def test_a_small_local_graph_goes_through_every_stage_without_ray_to_the_same_artifacts(reference, tiny_dataset, tmp_path):
    """Below ``--in-process-below`` texts, with no cluster to join, no Ray node starts and every stage runs
    in the driver, which the stages record as the node of their work; the artifacts equal those of the
    run on Ray. A cluster address keeps a small graph on the cluster."""
    out = tmp_path / "in-process"
    result = run_job(tiny_dataset, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "348 texts, fewer than --in-process-below 2,048: every stage runs in this process" in result.stdout
    assert "Ray's logs are in" not in result.stdout + result.stderr
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert stages["embed"]["info"]["texts_by_node"] == {"driver": 348}
    assert stages["features"]["info"]["rows_by_node"] == {"driver": 300}
    assert stages["subgraphs"]["info"]["blocks_by_node"] == {"driver": [0, 1, 2, 3]}
    ray_stages = json.loads((reference / "summary.json").read_text())["stages"]
    assert "driver" not in ray_stages["embed"]["info"]["texts_by_node"]
    _assert_same_artifacts(reference, out)


def test_a_graph_from_the_bfloat16_threshold_is_filtered_on_its_bfloat16_copy(reference, tiny_dataset, tmp_path):
    """From ``reduce.bfloat16_from_nodes`` nodes up, the features stage writes the copy, its manifest
    records it, the seeds' exact search screens it (the same seeds), and the subgraphs stage reads it: the seeds' cosines in the subgraphs move off the float32
    ones of the reference run, by bfloat16's rounding at most, and ``Artifacts.filter_features`` (what a
    served question is expanded with) is the copy."""
    out = tmp_path / "bf16"
    result = run_job(tiny_dataset, out, "reduce.bfloat16_from_nodes=300")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    art, ref = open_artifacts(out), open_artifacts(reference)
    np.testing.assert_array_equal(art.node_features, ref.node_features)  # float32 rows, as before
    assert bfloat16.FILE_NAME in json.loads((out / "features" / "manifest.json").read_text())["files"]
    assert art.filter_features.dtype == np.uint16 and ref.filter_features.dtype == np.float32
    np.testing.assert_array_equal(art.filter_features, bfloat16.to_bfloat16_bits(ref.node_features))
    # The seeds' exact search screened the copy (its Ray tasks did), and found the same seeds.
    assert json.loads((out / "summary.json").read_text())["stages"]["seeds"]["info"]["screened"] == bfloat16.FILE_NAME
    assert pq.read_table(out / "seeds" / "seeds.parquet").equals(pq.read_table(reference / "seeds" / "seeds.parquet"))
    mine, theirs = art.subgraphs(), ref.subgraphs()
    seed_scores = mine.score[mine.hop == 0]
    reference_scores = theirs.score[theirs.hop == 0]
    np.testing.assert_array_equal(mine.nodes[mine.hop == 0], theirs.nodes[theirs.hop == 0])
    assert not np.array_equal(seed_scores, reference_scores)
    np.testing.assert_allclose(seed_scores, reference_scores, atol=2.0**-7)


def test_the_features_map_over_ray_equals_projecting_in_one_process(reference, tiny_dataset, tmp_path):
    """The features stage's Ray Data map (one task per embedding shard, rows placed by id as they come
    back) writes the same ``node.npy`` as the library projecting every shard in its own process."""
    from seeder.config import SeederConfig, from_dict
    from seeder.preprocessing.stages import run_features

    config = from_dict(SeederConfig, json.loads((reference / "manifest.json").read_text())["config"])
    out = tmp_path / "features"
    out.mkdir()
    run_features(reference / "embed", out, open_dataset(tiny_dataset), config)
    np.testing.assert_array_equal(np.load(out / "node.npy"), np.load(reference / "features" / "node.npy"))
    info = json.loads((reference / "summary.json").read_text())["stages"]["features"]["info"]
    assert sum(info["rows_by_node"].values()) == 300


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux)")
def test_an_expansion_worker_over_its_feature_budget_lets_the_pages_go_with_the_same_subgraphs(reference, tiny_dataset):
    """``expand.resident_features_gb`` bounds the node-feature pages a worker keeps mapped between blocks;
    releasing them changes no subgraph."""
    from seeder.config import SeederConfig, from_dict, to_dict
    from seeder.preprocessing.stages import _features, expand_block
    from seeder.system.mapped import resident_bytes

    config = from_dict(SeederConfig, json.loads((reference / "manifest.json").read_text())["config"])
    expected = open_artifacts(reference).subgraphs().to_arrow()
    query_ids = expected.column("query_id").to_numpy()
    node_features = _features(reference / "features")[0]
    for budget, resident_after in ((1.0, lambda b: b > 0), (0.0, lambda b: b == 0)):
        config.expand.resident_features_gb = budget
        table, counts = expand_block(str(tiny_dataset), str(reference), query_ids, to_dict(config))
        assert table.equals(expected) and counts["queries"] == 40
        assert resident_after(resident_bytes(node_features)), (budget, resident_bytes(node_features))


def test_without_a_config_the_derived_step_budget_reaches_training(tiny_dataset, tmp_path):
    """No config file: preprocessing derives the policy's step budget with the other defaults, records
    it in the artifacts, and training uses it unless its own settings name one."""
    from pipelines import train

    out = tmp_path / "derived"
    command = [
        sys.executable,
        str(SCRIPT),
        "--dataset",
        str(tiny_dataset),
        "--out",
        str(out),
        "--ray-address",
        "local",
        "--num-cpus",
        "2",
        *FLAGS,
        "embed.encoder=hash",
        "embed.hash_dim=64",
        "reduce.dim=16",
        "expand.budget=30",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    budget = manifest["step_budget"]
    hops = manifest["config"]["expand"]["hops"]
    assert len(budget["expansion_sizes"]) == len(budget["frontier_caps"]) == hops
    assert (
        f"auto: train.expansion_sizes={budget['expansion_sizes']} train.frontier_caps={budget['frontier_caps']}" in result.stdout
    )
    job = train.prepare_job(str(out), None, ["train.epochs=1"], str(tmp_path / "model"), 1)
    assert job.config.train.expansion_sizes == budget["expansion_sizes"]
    assert job.config.train.frontier_caps == budget["frontier_caps"]
    own = train.prepare_job(
        str(out), None, ["train.expansion_sizes=[2,2]", "train.frontier_caps=[4,4]"], str(tmp_path / "model2"), 1
    )
    assert (own.config.train.expansion_sizes, own.config.train.frontier_caps) == ([2, 2], [4, 4])


def test_rerun_skips_every_stage_without_starting_ray(reference, tiny_dataset):
    before = {s: (reference / s / "manifest.json").stat().st_mtime_ns for s in STAGE_NAMES}
    result = run_job(tiny_dataset, reference)
    assert result.returncode == 0, result.stderr[-3000:]
    for stage in STAGE_NAMES:
        assert f"{stage}: " in result.stdout and "(skipped: up to date" in result.stdout
    assert result.stdout.count("skipped: up to date") == 4
    assert "Started a local Ray instance" not in result.stdout + result.stderr
    assert before == {s: (reference / s / "manifest.json").stat().st_mtime_ns for s in STAGE_NAMES}


def test_missing_dataset_and_bad_config_fail_fast_with_a_clear_message(tmp_path, tiny_dataset):
    result = run_job(tmp_path / "nowhere", tmp_path / "out")
    assert result.returncode == 2
    assert "no such dataset directory" in result.stderr and "seeder import" in result.stderr
    result = run_job(tiny_dataset, tmp_path / "out", "reduce.dim=100")
    assert result.returncode == 2 and "reduce.dim=100 exceeds embed.hash_dim=64" in result.stderr
    result = run_job(tiny_dataset, tmp_path / "out", "expand.hops=3")
    assert result.returncode == 2 and "needs one entry per hop" in result.stderr
    result = run_job(tiny_dataset, tmp_path / "out", "embed.encodr=hash")
    assert result.returncode == 2 and "unknown key embed.encodr" in result.stderr
    assert not (tmp_path / "out" / "embed").exists()


def test_a_second_run_into_the_same_out_fails_at_once_naming_the_first_ones_pid(tmp_path, tiny_dataset, capsys):
    from pipelines import preprocess
    from tests.processes import lock_held_by_another_process

    out = tmp_path / "art"
    with lock_held_by_another_process(out) as first:
        start = time.monotonic()
        code = preprocess.main(["--dataset", str(tiny_dataset), "--out", str(out), "--ray-address", "local", *FLAGS, *OVERRIDES])
        assert code == 2 and time.monotonic() - start < 30  # before Ray or any stage
    err = capsys.readouterr().err.strip()
    assert err == (
        f"preprocess: error: {out} is being written by process {first.pid} (it holds {tmp_path}/.art.lock); "
        f"wait for it to finish or choose another --out"
    )
    assert not out.exists()


@pytest.mark.slow
def test_killed_runs_resume_to_the_same_artifacts(reference, tiny_dataset, tmp_path):
    out = tmp_path / "killed"
    # Killed inside the embedding stage after one shard: nothing downstream exists, embed looks incomplete.
    first = run_job(tiny_dataset, out, env=_env(**{TEST_STOP_ENV: "embed:1"}))
    assert first.returncode == 137, first.stdout[-2000:] + first.stderr[-2000:]
    assert not (out / "embed").exists() and len(list((out / ".embed.partial").rglob("part-*.parquet"))) >= 1
    # Resumed, then killed inside the expansion stage after two of its four blocks.
    second = run_job(tiny_dataset, out, env=_env(**{TEST_STOP_ENV: "subgraphs:2"}))
    assert second.returncode == 137, second.stdout[-2000:] + second.stderr[-2000:]
    assert "embed: resuming" in second.stdout
    assert len(list((out / ".subgraphs.partial").glob("part-*.parquet"))) >= 2
    with pytest.raises(DataError, match="missing or incomplete"):
        open_artifacts(out).subgraphs()
    third = run_job(tiny_dataset, out)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert "subgraphs: resuming" in third.stdout and third.stdout.count("skipped: up to date") == 3
    assert not (out / ".subgraphs.partial").exists()
    _assert_same_artifacts(reference, out)


@pytest.mark.slow
def test_a_changed_config_section_reruns_only_its_stage_and_downstream(reference, tiny_dataset, tmp_path):
    out = tmp_path / "changed"
    shutil.copytree(reference, out)
    result = run_job(tiny_dataset, out, "expand.budget=20")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("skipped: up to date") == 3  # embed, features, seeds
    assert (open_artifacts(out).subgraphs().sizes <= 20).all()


# -- golden paths and the relation-path prior (expand.relation_score: learned) ---------------------

LEARNED = ["expand.relation_score=learned", "prior.epochs=5", "prior.min_count=1", "prior.hidden_dim=16"]


@pytest.fixture(scope="module")
def learned_reference(tiny_dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "learned"
    result = run_job(tiny_dataset, out, *LEARNED)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def _subgraph_selection(path: Path) -> dict[str, np.ndarray]:
    sub = open_artifacts(path).subgraphs()
    return {
        "query_ids": sub.query_ids,
        "node_ptr": sub.node_ptr,
        "nodes": sub.nodes,
        "hop": sub.hop,
        "score": sub.score,
        "edge_ptr": sub.edge_ptr,
        "edge_src": sub.edge_src,
        "edge_dst": sub.edge_dst,
        "edge_rel": sub.edge_rel,
    }


def test_learned_filter_adds_the_paths_and_prior_stages(learned_reference, tiny_dataset):
    from seeder.preprocessing.stages import read_golden_paths
    from seeder.retrieve.prior import RelationPathPrior

    summary = json.loads((learned_reference / "summary.json").read_text())
    assert list(summary["stages"]) == ["embed", "features", "seeds", "paths", "prior", "subgraphs"]
    kg = open_dataset(tiny_dataset)
    golden = read_golden_paths(learned_reference / "paths")
    train_ids = set(kg.queries_of("train").column("id").to_pylist())
    assert golden.num_rows > 0 and set(golden.column("query_id").to_pylist()) <= train_ids
    prior = RelationPathPrior.load(learned_reference / "prior")
    assert prior.info["vocab_size"] >= 1 and prior.num_relation_ids == 8
    # The ceiling of the learned filter is reported like the cosine one's.
    assert 0.0 < summary["ceiling"]["all"]["all"]["hit_any"] <= 1.0


def test_val_and_test_answers_never_change_seeds_paths_prior_or_subgraphs(learned_reference, tiny_dataset, tmp_path):
    from seeder.data.store import write_dataset

    kg = open_dataset(tiny_dataset)
    queries = kg.queries
    held_out = np.asarray(queries.column("split").to_pylist()) != "train"
    answers = [[0, 1] if h else a for a, h in zip(queries.column("answers").to_pylist(), held_out)]
    changed = queries.set_column(
        queries.column_names.index("answers"), "answers", pa.array(answers, queries.schema.field("answers").type)
    )
    other = write_dataset(tmp_path / "data", kg.nodes, kg.relations, kg.table("edges"), changed)
    out = tmp_path / "art"
    result = run_job(other, out, *LEARNED)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for left, right in zip(open_artifacts(learned_reference).seeds(), open_artifacts(out).seeds()):
        np.testing.assert_array_equal(left, right)
    assert pq.read_table(sorted((out / "paths").glob("part-*"))).equals(
        pq.read_table(sorted((learned_reference / "paths").glob("part-*")))
    )
    with np.load(out / "prior" / "prior.npz") as a, np.load(learned_reference / "prior" / "prior.npz") as b:
        for key in b.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    x, y = _subgraph_selection(learned_reference), _subgraph_selection(out)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.slow
def test_a_kill_in_the_paths_stage_resumes_to_the_same_artifacts(learned_reference, tiny_dataset, tmp_path):
    out = tmp_path / "killed"
    first = run_job(tiny_dataset, out, *LEARNED, env=_env(**{TEST_STOP_ENV: "paths:1"}))
    assert first.returncode == 137, first.stdout[-2000:] + first.stderr[-2000:]
    assert not (out / "paths").exists() and not (out / "prior").exists()
    assert len(list((out / ".paths.partial").glob("part-*.parquet"))) >= 1
    second = run_job(tiny_dataset, out, *LEARNED)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "paths: resuming" in second.stdout
    # The prior first: subgraphs that differ after an equal prior point at the subgraphs stage.
    with np.load(out / "prior" / "prior.npz") as a, np.load(learned_reference / "prior" / "prior.npz") as b:
        for key in b.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    x, y = _subgraph_selection(learned_reference), _subgraph_selection(out)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    _assert_same_artifacts(learned_reference, out)


# -- ray job submit against a real head ----------------------------------------------------------


def _kill_head(head: subprocess.Popen, temp_dir: Path) -> None:
    """Stop only this test's cluster: `ray stop` would stop every Ray process on the machine,
    including other people's, so kill the head's process group, then any process of its temp dir."""
    import psutil

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        try:
            head.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    mine = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(temp_dir) in " ".join(proc.info["cmdline"] or []):
                mine.append(proc)
        except psutil.Error:
            pass
    for proc in mine:
        try:
            proc.kill()
        except psutil.Error:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


def _cluster_test_submits_the_job() -> bool:
    """Whether tests/cluster/test_pipeline.py can run here: it submits this job to a three-node cluster
    and checks the same (the work stays on the cluster, the artifacts equal a one-node run's)."""
    from tests.cluster import harness

    return harness.cluster_unavailable_reason() is None and harness.s3_unavailable_reason() is None


@pytest.mark.slow
def test_job_runs_through_ray_job_submit_on_a_local_head(reference, tiny_dataset, tmp_path):
    """The one-head fallback of the cluster test, for machines where worker nodes cannot get mount
    namespaces of their own: the suite submits one job to a cluster, not two."""
    if _cluster_test_submits_the_job():
        pytest.skip("tests/cluster/test_pipeline.py submits this job to a multi-node cluster here")
    ray_bin = Path(sys.executable).with_name("ray")
    temp_dir = Path("/tmp") / f"rt-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths have a length limit
    dashboard = free_port()
    ports = {
        "--port": free_port(),
        "--dashboard-port": dashboard,
        "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--metrics-export-port": free_port(),
    }
    # The cluster's own token, for the head, the client and (inherited) the job: other Ray users of
    # this machine rewrite ~/.ray/auth_token, so the shared file cannot be relied on.
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    head = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            "--block",
            "--num-cpus=2",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={temp_dir}",
            *[f"{k}={v}" for k, v in ports.items()],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.time() + 240
        while True:
            probe = subprocess.run([str(ray_bin), "job", "list", "--address", address], capture_output=True, text=True, env=env)
            if probe.returncode == 0:
                break
            assert head.poll() is None, "ray start --head exited early"
            assert time.time() < deadline, f"the head's dashboard never answered: {probe.stderr[-1000:]}"
            time.sleep(2)
        out = tmp_path / "submitted"
        job = subprocess.run(
            [
                str(ray_bin),
                "job",
                "submit",
                "--address",
                address,
                "--working-dir",
                str(REPO),
                "--",
                sys.executable,
                "pipelines/preprocess.py",
                "--dataset",
                str(tiny_dataset),
                "--out",
                str(out),
                *FLAGS,
                *OVERRIDES,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            cwd=REPO,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout
        assert "Started a local Ray instance" not in job.stdout  # it joined the head
        # A small graph stays on the cluster it was sent to.
        assert "driver" not in json.loads((out / "summary.json").read_text())["stages"]["embed"]["info"]["texts_by_node"]
        _assert_same_artifacts(reference, out)
    finally:
        _kill_head(head, temp_dir)


@pytest.mark.parametrize("strategy", ["bm25", "hybrid"])
def test_lexical_seed_strategies(reference, tiny_dataset, tmp_path, strategy):
    """BM25 seeding finds the entity a query names word for word; hybrid fuses it with dense."""
    from seeder.preprocessing.stages import run_seeds

    config = load_config(None, OVERRIDES + [f"seed.strategy={strategy}", "seed.k0=3"])
    kg = open_dataset(tiny_dataset)
    out = tmp_path / "seeds"
    out.mkdir()
    info = run_seeds(reference / "features", out, kg, config)
    assert info["strategy"] == strategy and info["empty"] == 0
    table = pq.read_table(out / "seeds.parquet").sort_by("query_id")
    queries = kg.queries.sort_by("id")
    names = kg.nodes.column("name").to_pylist()
    # Every query is "what is related to entity N colour": the node with exactly that name must be seeded.
    named = [names.index(text.removeprefix("what is related to ")) for text in queries.column("text").to_pylist()]
    seeds = table.column("seeds").to_pylist()
    assert all(len(s) == 3 and len(set(s)) == 3 for s in seeds)
    hits = np.mean([n in s for n, s in zip(named, seeds)])
    assert hits >= 0.9, hits
    if strategy == "bm25":
        assert np.mean([s[0] == n for n, s in zip(named, seeds)]) >= 0.9


@pytest.mark.slow
def test_dataset_and_artifacts_may_be_uris(reference, tiny_dataset, tmp_path):
    """--dataset and --out as file:// URIs: the dataset is fetched, the artifacts are staged locally
    and published only when every stage finished, and they equal the local run's."""
    from seeder.system import storage

    dataset_uri, out_uri = f"file://{tmp_path}/remote/dataset", f"file://{tmp_path}/remote/artifacts"
    storage.publish(tiny_dataset, dataset_uri)
    env = _env(SEEDER_CACHE=str(tmp_path / "cache"))
    failed = run_job(dataset_uri, out_uri, "embed.encodr=hash", env=env)
    assert failed.returncode == 2 and not (tmp_path / "remote" / "artifacts").exists()
    result = run_job(dataset_uri, out_uri, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    published = tmp_path / "remote" / "artifacts"
    assert json.loads((published / "manifest.json").read_text())["dataset"] == dataset_uri
    assert json.loads((published / "summary.json").read_text())["artifacts"] == out_uri
    _assert_same_artifacts(reference, published)


def test_preprocess_refuses_an_out_that_is_not_artifacts(tmp_path, capsys):
    """A mistyped --out (here: the dataset itself) is refused before anything is written into it."""
    from pipelines.preprocess import main

    dataset = write_tiny_dataset(tmp_path / "ds", 12, seed=0, two_hop_answers=False, id_stride=3)
    before = {p: p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    assert main(["--dataset", str(dataset), "--out", str(dataset), *OVERRIDES]) == 2
    assert "not an artifacts directory" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in dataset.rglob("*") if p.is_file()} == before


# -- verified artifacts: damaged outputs are named and recomputed, mismatches are errors ---------------


def _damaged_copy(reference: Path, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(reference, out)
    return out


def _truncate(path: Path, size: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


def test_readers_refuse_a_missing_or_truncated_output_naming_the_file_and_the_fix(reference, tiny_dataset, tmp_path):
    out = _damaged_copy(reference, tmp_path, "readers")
    shard = sorted((out / "subgraphs").glob("part-*.parquet"))[2]
    shard.unlink()
    with pytest.raises(DataError) as err:
        open_artifacts(out)
    message = str(err.value)
    assert f"{out}/subgraphs/{shard.name}: missing" in message
    assert f"rerun `python pipelines/preprocess.py --dataset {tiny_dataset} --out {out}`" in message
    shutil.copy(reference / "subgraphs" / shard.name, shard)
    _truncate(out / "features" / "node.npy")
    from seeder.cli.main import main

    assert main(["evaluate", "--artifacts", str(out), "--method", "dense"]) == 2  # no mmap traceback
    with pytest.raises(DataError, match=rf"{out}/features/node.npy: size 100 != recorded \d+ bytes"):
        open_artifacts(out)


@pytest.mark.slow
def test_a_deleted_subgraph_shard_is_recomputed_naming_the_file(reference, tiny_dataset, tmp_path):
    out = _damaged_copy(reference, tmp_path, "deleted-shard")
    (out / "subgraphs" / "part-000002.parquet").unlink()
    result = run_job(tiny_dataset, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "subgraphs: subgraphs/part-000002.parquet: missing" in result.stdout
    assert "subgraphs: resuming, 3 of 4 blocks kept" in result.stdout
    assert result.stdout.count("skipped: up to date") == 3
    _assert_same_artifacts(reference, out)


@pytest.mark.slow
def test_a_truncated_feature_file_recomputes_features_and_the_stages_after_it(reference, tiny_dataset, tmp_path):
    out = _damaged_copy(reference, tmp_path, "truncated")
    _truncate(out / "features" / "node.npy")
    result = run_job(tiny_dataset, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "features: features/node.npy: size 100 != recorded" in result.stdout
    assert "seeds: recomputing, since features was recomputed in this run" in result.stdout
    assert result.stdout.count("skipped: up to date") == 1  # embed
    _assert_same_artifacts(reference, out)


@pytest.mark.slow
def test_a_deleted_embed_shard_reruns_embed(reference, tiny_dataset, tmp_path):
    out = _damaged_copy(reference, tmp_path, "embed-shard")
    (out / "embed" / "nodes" / "part-000001.parquet").unlink()
    result = run_job(tiny_dataset, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "embed: embed/nodes/part-000001.parquet: missing" in result.stdout
    assert "embed: resuming" in result.stdout and "skipped: up to date" not in result.stdout
    assert (out / "embed" / "nodes" / "part-000001.parquet").is_file()
    again = run_job(tiny_dataset, out)
    assert again.returncode == 0 and again.stdout.count("skipped: up to date") == 4
    _assert_same_artifacts(reference, out)


def _with_regenerated_dataset(reference: Path, tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A copy of the reference artifacts whose dataset was written again, with other content, at its path."""
    dataset = write_tiny_dataset(tmp_path / "dataset", 40, seed=7, two_hop_answers=False, id_stride=7)
    old = open_dataset(dataset).fingerprint
    out = _damaged_copy(reference, tmp_path, "art")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(dataset=str(dataset), dataset_fingerprint=old)
    (out / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(dataset)
    write_tiny_dataset(dataset, 40, seed=8, two_hop_answers=False, id_stride=7)
    return out, dataset, old, open_dataset(dataset).fingerprint


def test_a_dataset_regenerated_under_the_artifacts_path_is_an_error_naming_both_fingerprints(reference, tmp_path, capsys):
    from seeder.cli.main import main
    from seeder.preprocessing.artifacts import FingerprintMismatch

    out, dataset, old, new = _with_regenerated_dataset(reference, tmp_path)
    assert old != new
    with pytest.raises(FingerprintMismatch) as err:
        open_artifacts(out).dataset
    assert old in str(err.value) and new in str(err.value) and "--accept-mismatch" in str(err.value)
    assert main(["evaluate", "--artifacts", str(out), "--method", "dense"]) == 2
    assert f"dataset fingerprint {old}" in capsys.readouterr().err
    with pytest.warns(UserWarning, match=f"{old}.*{new}"):
        assert main(["evaluate", "--artifacts", str(out), "--method", "dense", "--accept-mismatch"]) == 0


def test_a_model_on_artifacts_of_another_graph_is_an_error_unless_accepted(reference, tmp_path, capsys):
    from seeder import Retriever
    from seeder.cli.main import main
    from seeder.policy.checkpoint import artifacts_record
    from seeder.preprocessing.artifacts import FingerprintMismatch
    from seeder.preprocessing.stages import stage_fingerprints
    from seeder.training.loop import build_state, export_best

    trained_on = open_artifacts(reference)
    config = load_config(None, [*OVERRIDES, "model.hidden_dim=16", "model.num_layers=1"])
    model = export_best(build_state(config, 16, 1, artifacts_record(trained_on)), tmp_path / "model")
    assert json.loads((model / "seeder_model.json").read_text())["artifacts"]["fingerprint"] == trained_on.fingerprint
    Retriever.load(model)  # its own artifacts
    # Artifacts of another graph with features of the same width, as preprocessing would record them.
    other_graph = write_tiny_dataset(tmp_path / "other", 40, seed=8, two_hop_answers=False, id_stride=7)
    other = _damaged_copy(reference, tmp_path, "other-art")
    manifest = json.loads((other / "manifest.json").read_text())
    fingerprint = open_dataset(other_graph).fingerprint
    manifest.update(
        dataset=str(other_graph),
        dataset_fingerprint=fingerprint,
        fingerprints=stage_fingerprints(load_config(None, OVERRIDES), fingerprint, open_dataset(other_graph).num_nodes),
    )
    (other / "manifest.json").write_text(json.dumps(manifest))
    other_fp = open_artifacts(other).fingerprint
    with pytest.raises(FingerprintMismatch) as err:
        Retriever.load(model, artifacts=other)
    assert trained_on.fingerprint in str(err.value) and other_fp in str(err.value)
    with pytest.warns(UserWarning, match="accepted"):
        Retriever.load(model, artifacts=other, accept_mismatch=True)
    assert main(["evaluate", "--artifacts", str(other), "--method", "seeder", "--model", str(model)]) == 2
    assert f"dataset fingerprint {trained_on.dataset_fingerprint} != {fingerprint}" in capsys.readouterr().err
    with pytest.warns(UserWarning):
        assert (
            main(["evaluate", "--artifacts", str(other), "--method", "seeder", "--model", str(model), "--accept-mismatch"]) == 0
        )


def test_the_embedding_pool_gives_gpu_actors_larger_batches():
    from pipelines.preprocess import GPU_BLOCK_ROWS, block_rows, embed_pool
    from seeder.config import EmbedConfig

    actors, threads, remote = embed_pool({"CPU": 16.0, "GPU": 2.0}, EmbedConfig())
    assert (actors, threads, remote) == (8, 1, {"num_gpus": 0.25, "num_cpus": 1.0})  # four actors share each GPU
    assert embed_pool({"CPU": 16.0, "GPU": 2.0}, EmbedConfig(actors_per_gpu=1))[::2] == (2, {"num_gpus": 1.0, "num_cpus": 1.0})
    assert embed_pool({"CPU": 16.0, "GPU": 2.0}, EmbedConfig(num_actors=3))[2]["num_gpus"] == 0.5  # 2 on one GPU, 1 on the other
    # Each actor reserves a whole CPU where there are enough, so two never crowd onto a one-CPU node; a
    # GPU node with fewer CPUs than actors shares them out.
    assert embed_pool({"CPU": 4.0, "GPU": 1.0}, EmbedConfig())[2] == {"num_gpus": 0.25, "num_cpus": 1.0}
    assert embed_pool({"CPU": 2.0, "GPU": 1.0}, EmbedConfig())[2] == {"num_gpus": 0.25, "num_cpus": 0.5}
    from seeder.config import ConfigError, load_config
    from seeder.preprocessing.stages import check_config

    with pytest.raises(ConfigError, match="embed.actors_per_gpu >= 1"):
        check_config(load_config(None, ["embed.actors_per_gpu=0"]))
    actors, threads, remote = embed_pool({"CPU": 2.0}, EmbedConfig())
    assert actors == 2 and "num_gpus" not in remote
    assert block_rows(1024, gpu=True) == GPU_BLOCK_ROWS > 1024
    assert block_rows(4 * GPU_BLOCK_ROWS, gpu=True) == 4 * GPU_BLOCK_ROWS  # a larger request stands
    assert block_rows(1024, gpu=False) == 1024
