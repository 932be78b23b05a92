"""The dataset store: CSR against a brute-force build, validation messages, atomic writes, reopening, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from seeder.data.store import build_csr, edge_hashes, open_dataset, summarize, validate_tables, write_dataset
from seeder.system.io import DataError, read_manifest


def tables(n=6, edges=((0, 1, 0), (1, 2, 1), (2, 0, 0), (0, 3, 1), (4, 4, 0), (0, 1, 1)), answers=([1], [2, 3])):
    nodes = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "type": ["t"] * n,
            "name": [f"n{i}" for i in range(n)],
            "text": [f"node {i}" for i in range(n)],
        }
    )
    relations = pa.table(
        {"id": np.arange(2, dtype=np.int32), "name": ["a", "b"], "text": ["a", "b"], "inverse_text": ["inv a", "inv b"]}
    )
    e = np.array(edges, dtype=np.int64).reshape(-1, 3)
    edge_table = pa.table({"src": e[:, 0], "dst": e[:, 1], "relation": e[:, 2].astype(np.int32)})
    queries = pa.table(
        {
            "id": np.arange(len(answers), dtype=np.int64),
            "text": [f"q{i}" for i in range(len(answers))],
            "answers": pa.array(list(answers), pa.list_(pa.int64())),
            "split": (["train", "val", "test"] * 3)[: len(answers)],
            "hop": [1] * len(answers),
        }
    )
    return nodes, relations, edge_table, queries


def test_csr_matches_brute_force_on_a_random_multigraph():
    rng = np.random.default_rng(0)
    n, r, e = 200, 4, 3_000
    src, dst = rng.integers(n, size=e), rng.integers(n, size=e)
    rel = rng.integers(r, size=e).astype(np.int32)
    indptr, nbrs, rels = build_csr(n, r, src, dst, rel)
    assert indptr.dtype == np.int64 and nbrs.dtype == np.int32 and rels.dtype == np.int32
    for u in range(n):
        expected = [(int(dst[i]), int(rel[i])) for i in range(e) if src[i] == u]
        expected += [(int(src[i]), int(rel[i]) + r) for i in range(e) if dst[i] == u]
        got = list(zip(nbrs[indptr[u] : indptr[u + 1]].tolist(), rels[indptr[u] : indptr[u + 1]].tolist()))
        assert sorted(got) == sorted(expected), u
        order = edge_hashes(np.full(len(got), u), nbrs[indptr[u] : indptr[u + 1]], rels[indptr[u] : indptr[u + 1]])
        assert np.all(order[1:] >= order[:-1]), u  # each slice in edge-hash order


def test_a_hubs_sample_moves_only_where_an_edge_inside_it_changes():
    """The first ``cap`` entries of a slice are its sample (``sampled_slices``). Adding or removing an
    edge outside them leaves them as they were; one inside them swaps one entry, not the rest."""
    rng = np.random.default_rng(3)
    leaves, cap = 2_000, 100
    src, dst, rel = np.zeros(leaves, np.int64), np.arange(1, leaves + 1), np.zeros(leaves, np.int64)
    n = leaves + 200
    before = build_csr(n, 1, src, dst, rel)[1][:cap].tolist()
    seen = set()
    for extra in range(leaves + 1, n):  # new leaves of the hub until one lands inside its sample
        grown = build_csr(n, 1, np.append(src, 0), np.append(dst, extra), np.append(rel, 0))[1][:cap].tolist()
        inside = extra in grown
        assert len(set(grown) ^ set(before)) == (2 if inside else 0)
        seen.add(inside)
        if seen == {True, False}:
            break
    assert seen == {True, False}
    keep = np.ones(leaves, bool)
    keep[rng.choice(np.flatnonzero(~np.isin(dst, before)), 500, replace=False)] = False
    assert build_csr(n, 1, src[keep], dst[keep], rel[keep])[1][:cap].tolist() == before
    keep[np.flatnonzero(dst == before[7])] = False
    shrunk = build_csr(n, 1, src[keep], dst[keep], rel[keep])[1][:cap].tolist()
    assert len(set(shrunk) ^ set(before)) == 2 and before[7] not in shrunk


def test_write_reopen_and_read_back(tmp_path):
    out = write_dataset(tmp_path / "ds", *tables(), source={"format": "test"})
    kg = open_dataset(out)
    assert (kg.num_nodes, kg.num_relations, kg.num_edges) == (6, 2, 6)
    assert kg.relation_texts == ["a", "b", "inv a", "inv b"]
    assert kg.degree().tolist() == [4, 3, 2, 1, 2, 0]  # self-loop on 4 counts in both directions
    assert kg.queries_of("val").column("answers").to_pylist() == [[2, 3]]
    assert kg.manifest["query_attributes"] == ["hop"]
    assert isinstance(kg.neighbors, np.memmap)
    summary = summarize(kg)
    assert summary["edges_per_relation"] == {"a": 3, "b": 3}
    assert summary["queries"]["train"] == {"queries": 1, "hop": {"1": 1}}


def test_pickles_as_path_and_reopens_memmaps(tmp_path):
    kg = open_dataset(write_dataset(tmp_path / "ds", *tables()))
    _ = kg.neighbors
    blob = pickle.dumps(kg)
    assert len(blob) < 500  # a path, not arrays
    again = pickle.loads(blob)
    assert again.path == kg.path and np.array_equal(again.neighbors, kg.neighbors)


def test_existing_directory_needs_overwrite(tmp_path):
    write_dataset(tmp_path / "ds", *tables())
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_dataset(tmp_path / "ds", *tables())
    write_dataset(tmp_path / "ds", *tables(n=7), overwrite=True)
    assert open_dataset(tmp_path / "ds").num_nodes == 7


def test_failed_write_leaves_no_dataset_and_keeps_the_old_one(tmp_path, monkeypatch):
    import seeder.data.store as store

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store, "build_csr", boom)
    with pytest.raises(OSError):
        write_dataset(tmp_path / "new", *tables())
    assert not (tmp_path / "new").exists()
    assert not list(tmp_path.iterdir())  # no partial directory left behind
    monkeypatch.undo()
    write_dataset(tmp_path / "old", *tables())
    monkeypatch.setattr(store, "build_csr", boom)
    with pytest.raises(OSError):
        write_dataset(tmp_path / "old", *tables(n=9), overwrite=True)
    assert open_dataset(tmp_path / "old").num_nodes == 6


def test_open_rejects_missing_and_partial(tmp_path):
    with pytest.raises(DataError, match="no such dataset directory"):
        open_dataset(tmp_path / "nothing")
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "nodes.parquet").write_bytes(b"")
    with pytest.raises(DataError, match="interrupted import"):
        open_dataset(tmp_path / "partial")
    assert read_manifest(tmp_path / "partial") is None


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda t: (t[0].set_column(0, "id", pa.array([0, 1, 1, 3, 4, 5], pa.int64())),) + t[1:],
            r"nodes: 1 duplicate node ids, first: 1",
        ),
        (lambda t: (t[0].set_column(0, "id", pa.array([0, 1, 2, 3, 4, 7], pa.int64())),) + t[1:], r"contiguous 0..N-1.*7"),
        (
            lambda t: (t[0].set_column(3, "text", pa.array(["a", "", "c", "d", " ", "f"])),) + t[1:],
            r"nodes: 2 rows with empty text, first ids: 1, 4",
        ),
        (
            lambda t: t[:2] + (pa.table({"src": [0, 9], "dst": [1, 2], "relation": pa.array([0, 0], pa.int32())}),) + t[3:],
            r"edges: 1 edges whose src is not a node id \(0..5\), first rows 1 with src 9",
        ),
        (
            lambda t: t[:2] + (pa.table({"src": [0], "dst": [1], "relation": pa.array([5], pa.int32())}),) + t[3:],
            r"edges: 1 edges with an unknown relation id \(known: 0..1\), first rows 0 with relation 5",
        ),
        (
            lambda t: tables(answers=([1], []))[:3] + (tables(answers=([1], []))[3],),
            r"queries: 1 queries without answers, first ids: 1",
        ),
        (
            lambda t: t[:3] + (tables(answers=([1], [42]))[3],),
            r"queries: 1 answer ids are not nodes of the graph, first \(query id: answer id\): 1: 42",
        ),
        (lambda t: t[:2] + (t[2].drop_columns(["dst"]),) + t[3:], r"edges: missing column 'dst'"),
        (
            lambda t: t[:2] + (pa.table({"src": ["x"], "dst": [1], "relation": pa.array([0], pa.int32())}),) + t[3:],
            r"edges: column 'src' has type string, expected int64",
        ),
        (lambda t: t[:3] + (t[3].set_column(3, "split", pa.array(["train", "dev"])),), r"unknown split values \['dev'\]"),
        (lambda t: (t[0], t[1].slice(0, 0)) + t[2:], r"relations: the table is empty"),
    ],
)
def test_validation_messages(mutate, message):
    with pytest.raises(DataError, match=message):
        validate_tables(*mutate(tables()))
