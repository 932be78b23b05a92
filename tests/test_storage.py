"""Remote storage: fetch/publish through pyarrow filesystems, on a file:// URI and an in-process S3 server."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from seeder import storage
from seeder.io import DataError
from seeder.store import open_dataset, write_dataset


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


def test_bad_uri_is_a_clear_error():
    with pytest.raises(DataError, match="not a usable storage URI"):
        storage.fetch("nosuchscheme://x/y")
