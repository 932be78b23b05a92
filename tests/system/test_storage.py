"""Remote storage: fetch/publish through pyarrow filesystems, on a file:// URI and an in-process S3 server,
and the seeder command (info, evaluate, retrieve) reading its inputs from both."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from seeder.data.store import open_dataset, write_dataset
from seeder.system import storage
from seeder.system.io import DataError


def _tiny_dataset(path):
    nodes = pa.table({"id": [0, 1, 2], "type": ["a", "a", "b"], "name": ["x", "y", "z"], "text": ["x", "y", "z"]})
    relations = pa.table({"id": pa.array([0], pa.int32()), "name": ["r"], "text": ["r"], "inverse_text": ["r inv"]})
    edges = pa.table({"src": [0, 1], "dst": [1, 2], "relation": pa.array([0, 0], pa.int32())})
    queries = pa.table({"id": [7], "text": ["q"], "answers": [[2]], "split": ["train"]})
    return write_dataset(path, nodes, relations, edges, queries)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDER_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def s3_uri():
    """A bucket on an S3-compatible server in this process, bound to loopback."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    query = f"endpoint_override=http://{host}:{port}&scheme=http&region=us-east-1&allow_bucket_creation=true"
    fs, _ = pafs.FileSystem.from_uri(f"s3://seeder-test?{query}")
    fs.create_dir("seeder-test")
    yield f"s3://seeder-test/run?{query}"
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_is_uri_and_join():
    assert storage.is_uri("s3://b/p") and storage.is_uri("file:///tmp/x")
    assert not storage.is_uri("/tmp/x") and not storage.is_uri("runs/demo")
    assert storage.join("s3://b/p?endpoint_override=h", "ds", "nodes.parquet") == "s3://b/p/ds/nodes.parquet?endpoint_override=h"


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_publish_then_fetch_roundtrip(tmp_path, backend, request):
    base = f"file://{tmp_path}/remote" if backend == "file" else request.getfixturevalue("s3_uri")
    uri = storage.join(base, "dataset")
    local = _tiny_dataset(tmp_path / "local")
    storage.publish(local, uri)
    fetched = storage.fetch(uri)
    assert fetched != local
    kg = open_dataset(fetched)
    assert kg.num_nodes == 3 and np.array_equal(kg.indptr, open_dataset(local).indptr)
    # A second fetch of an unchanged directory reuses the cache.
    marker = fetched / "marker"
    marker.write_text("cached")
    assert storage.fetch(uri) == fetched and marker.exists()


def test_fetch_refuses_an_incomplete_remote_directory(tmp_path):
    local = _tiny_dataset(tmp_path / "local")
    uri = f"file://{tmp_path}/remote/dataset"
    storage.publish(local, uri)
    os.remove(tmp_path / "remote" / "dataset" / "manifest.json")
    with pytest.raises(DataError, match="no manifest.json there"):
        storage.fetch(uri)


def test_publish_refuses_an_incomplete_local_directory(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "nodes.parquet").write_bytes(b"")
    with pytest.raises(DataError, match="not complete"):
        storage.publish(tmp_path / "half", f"file://{tmp_path}/remote")
    assert not (tmp_path / "remote").exists()


def test_republish_removes_the_old_manifest_first(tmp_path, monkeypatch):
    """If an upload dies midway, the remote directory must not look complete."""
    local = _tiny_dataset(tmp_path / "local")
    uri = f"file://{tmp_path}/remote"
    storage.publish(local, uri)
    calls = {"n": 0}
    real_copy = pafs.copy_files

    def failing_copy(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("network down")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(pafs, "copy_files", failing_copy)
    with pytest.raises(OSError):
        storage.publish(local, uri)
    assert not (tmp_path / "remote" / "manifest.json").exists()


def test_output_directory_stages_locally_and_publishes(tmp_path, s3_uri):
    uri = storage.join(s3_uri, "artifacts")
    with storage.output_directory(uri) as out:
        assert not storage.is_uri(str(out))
        (out / "stage").mkdir(exist_ok=True)
        (out / "stage" / "data.txt").write_text("payload")
        (out / "manifest.json").write_text(json.dumps({"kind": "test"}))
    fetched = storage.fetch(uri)
    assert (fetched / "stage" / "data.txt").read_text() == "payload"


def test_local_output_directory_is_the_path_itself(tmp_path):
    with storage.output_directory(tmp_path / "out") as out:
        assert out == tmp_path / "out"


def test_filesystem_lists_the_same_directory_by_path_and_by_file_uri(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    by_path, by_uri = storage.filesystem(tmp_path / "d"), storage.filesystem((tmp_path / "d").as_uri())
    for fs, root in (by_path, by_uri):
        assert [i.base_name for i in fs.get_file_info(pafs.FileSelector(root))] == ["a.txt"]
    assert isinstance(by_path[0], pafs.LocalFileSystem) and by_path[1] == str(tmp_path / "d")


def test_bad_uri_is_a_clear_error():
    with pytest.raises(DataError, match="not a usable storage URI"):
        storage.fetch("nosuchscheme://x/y")


# -- the seeder command on URIs ----------------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _artifacts_with_a_model(root):
    """A 40-node dataset, artifacts written by hand in their layout (8-dim features, hash encoder, so
    that `seeder retrieve` embeds a question to the same width) and an untrained model checkpoint."""
    from seeder.config import load_config, to_dict
    from seeder.data.store import write_dataset
    from seeder.retrieve.khop import expand_queries
    from seeder.retrieve.seeds import dense_seeds
    from seeder.system.io import write_manifest
    from seeder.training.loop import build_state, export_best

    rng = np.random.default_rng(5)
    n, r, q, dim = 40, 2, 6, 8
    names = [f"node {i}" for i in range(n)]
    answers = [[int(a)] for a in rng.choice(n, q, replace=False)]
    dataset = write_dataset(
        root / "dataset",
        pa.table({"id": np.arange(n), "type": ["e"] * n, "name": names, "text": names}),
        pa.table({"id": np.arange(r, dtype=np.int32), "name": ["a", "b"], "text": ["a", "b"], "inverse_text": ["a-", "b-"]}),
        pa.table(
            {"src": rng.integers(0, n, 120), "dst": rng.integers(0, n, 120), "relation": rng.integers(0, r, 120).astype(np.int32)}
        ),
        pa.table(
            {"id": np.arange(q) + 100, "text": [f"question {i}" for i in range(q)], "answers": answers, "split": ["val"] * q}
        ),
    )
    kg = open_dataset(dataset)
    nf, rf, qf = (_unit(rng.standard_normal((rows, dim))) for rows in (n, 2 * r, q))
    config = load_config(
        None,
        [
            "embed.encoder=hash",
            f"embed.hash_dim={dim}",
            "expand.budget=10",
            "expand.keep_per_hop=[4,6]",
            "model.hidden_dim=16",
            "model.num_layers=1",
            "train.expansion_sizes=[3,3]",
            "train.frontier_caps=[8,8]",
        ],
    )
    out = root / "artifacts"
    (out / "features").mkdir(parents=True)
    for name, array in (("node", nf), ("relation", rf), ("query", qf), ("query_ids", np.arange(q) + 100)):
        np.save(out / "features" / f"{name}.npy", array)
    write_manifest(out / "features", {"stage": "features"})
    seeds, scores = dense_seeds(qf, nf, 3)
    subgraphs = expand_queries(
        kg,
        nf,
        rf,
        qf,
        seeds,
        scores,
        config.expand,
        np.arange(q) + 100,
        np.array(["val"] * q, dtype=object),
        np.arange(q + 1),
        np.concatenate(answers),
    )
    (out / "subgraphs").mkdir()
    pq.write_table(subgraphs.to_arrow(), out / "subgraphs" / "part-00000.parquet")
    write_manifest(out / "subgraphs", {"stage": "subgraphs"})
    write_manifest(out, {"kind": "seeder-artifacts", "dataset": str(dataset), "config": to_dict(config)})
    model = export_best(build_state(config, dim, 1), root / "model")
    return dataset, out, model


def _seeder(capsys, *args: str) -> str:
    from seeder.cli.main import main

    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_info_evaluate_and_retrieve_read_uris(tmp_path, backend, request, capsys):
    """The dataset and the artifacts (whose manifest names the dataset by its URI) published to a
    file:// URI or to S3 give the same counts, metrics and answers as the local directories."""
    dataset, artifacts, model = _artifacts_with_a_model(tmp_path / "local")
    base = f"file://{tmp_path}/remote" if backend == "file" else storage.join(request.getfixturevalue("s3_uri"), "cli")
    dataset_uri, artifacts_uri = storage.join(base, "dataset"), storage.join(base, "artifacts")
    storage.publish(dataset, dataset_uri)
    remote_manifest = {**json.loads((artifacts / "manifest.json").read_text()), "dataset": dataset_uri}
    staged = tmp_path / "staged"
    shutil.copytree(artifacts, staged)
    (staged / "manifest.json").write_text(json.dumps(remote_manifest))
    storage.publish(staged, artifacts_uri)
    shutil.rmtree(staged)

    local_info, remote_info = (json.loads(_seeder(capsys, "info", str(d), "--json")) for d in (dataset, dataset_uri))
    assert remote_info.pop("path") == dataset_uri and local_info.pop("path") == str(dataset)
    assert remote_info == local_info and remote_info["nodes"] == 40

    reports = []
    for i, location in enumerate((artifacts, artifacts_uri)):
        _seeder(capsys, "evaluate", "--artifacts", str(location), "--method", "dense,khop", "--json", str(tmp_path / f"{i}.json"))
        reports.append(json.loads((tmp_path / f"{i}.json").read_text()))
    assert reports[1]["artifacts"] == artifacts_uri and reports[1]["queries"] == 6
    assert reports[1]["methods"] == reports[0]["methods"] and reports[1]["ceiling"] == reports[0]["ceiling"]

    local, remote = (
        _seeder(capsys, "retrieve", "--artifacts", str(location), "--model", str(model), "-k", "5", "question 3")
        for location in (artifacts, artifacts_uri)
    )
    lines = remote.splitlines()
    assert (
        remote == local
        and lines[1].split()[0] == "rank"
        and [line.split()[0] for line in lines[2:7]] == ["1", "2", "3", "4", "5"]
    )


def test_a_uri_without_a_dataset_is_a_one_line_error(tmp_path, capsys):
    from seeder.cli.main import main

    assert main(["info", f"file://{tmp_path}/nowhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"seeder info: error: file://{tmp_path}/nowhere: no manifest.json there") and "\n" not in err
