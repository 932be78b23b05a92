"""Ownership of outputs: --overwrite replaces only what this tool wrote, and one writer at a time per output."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

import pytest

from seeder.data.store import open_dataset, write_dataset
from seeder.system.io import (
    DataError,
    OutputLocked,
    atomic_directory,
    check_replaceable,
    lock_path,
    output_lock,
    write_manifest,
)
from tests.data.test_store import tables
from tests.processes import lock_held_by_another_process


def snapshot(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_folder_this_tool_did_not_write_and_leaves_it_untouched(tmp_path):
    home = tmp_path / "home"
    (home / "photos").mkdir(parents=True)
    (home / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (home / "notes.txt").write_text("do not delete")
    (home / "manifest.json").write_text(json.dumps({"kind": "someone-else"}))
    before = snapshot(home)
    with pytest.raises(
        DataError,
        match=r"home: not a directory this tool wrote .*left untouched rather than replaced; "
        r"remove it yourself",
    ):
        write_dataset(home, *tables(), overwrite=True)
    assert snapshot(home) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no partial directory, no lock file left


@pytest.mark.parametrize("make", ["empty", "dataset", "artifacts"])
def test_overwrite_replaces_an_empty_directory_a_dataset_or_artifacts(tmp_path, make):
    target = tmp_path / "out"
    if make == "empty":
        target.mkdir()
    elif make == "dataset":
        write_dataset(target, *tables(n=9))
    else:
        (target / "features").mkdir(parents=True)
        write_manifest(target, {"kind": "seeder-artifacts", "dataset": "x", "config": {}})
    write_dataset(target, *tables(n=7), overwrite=True)
    assert open_dataset(target).num_nodes == 7


def test_overwrite_refuses_a_file_a_link_and_an_unreadable_manifest(tmp_path):
    (tmp_path / "file").write_text("data")
    with pytest.raises(DataError, match=r"file: is a file, not a directory, so it is left untouched"):
        check_replaceable(tmp_path / "file", overwrite=True)
    write_dataset(tmp_path / "ds", *tables())
    (tmp_path / "link").symlink_to(tmp_path / "ds")
    with pytest.raises(DataError, match=r"link: is a symbolic link"):
        write_dataset(tmp_path / "link", *tables(), overwrite=True)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "manifest.json").write_text("{ not json")
    with pytest.raises(DataError, match=r"odd: not a directory this tool wrote"):
        check_replaceable(tmp_path / "odd", overwrite=True)
    assert (tmp_path / "file").read_text() == "data" and (tmp_path / "odd" / "manifest.json").read_text() == "{ not json"
    with pytest.raises(FileExistsError, match=r"already exists; choose another --out or pass --overwrite"):
        check_replaceable(tmp_path / "odd", overwrite=False)


def test_a_marker_file_makes_a_directory_replaceable(tmp_path):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.json").write_text("{}")
    with atomic_directory(tmp_path / "report", overwrite=True, marker="report.json") as tmp:
        (tmp / "report.json").write_text('{"new": 1}')
    assert (tmp_path / "report" / "report.json").read_text() == '{"new": 1}'
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("x")
    with pytest.raises(DataError, match=r"it has no manifest.json of kind seeder-dataset or seeder-artifacts, nor report.json"):
        check_replaceable(tmp_path / "other", overwrite=True, marker="report.json")


def test_a_second_writer_fails_at_once_naming_the_holders_pid(tmp_path):
    out = tmp_path / "ds"
    with lock_held_by_another_process(out) as holder:
        assert lock_path(out).read_text().strip() == str(holder.pid)
        start = time.monotonic()
        with pytest.raises(
            OutputLocked,
            match=rf"ds is being written by process {holder.pid} \(it holds .*\.ds\.lock\); "
            r"wait for it to finish or choose another --out",
        ):
            write_dataset(out, *tables())
        assert time.monotonic() - start < 5  # at once: no waiting for the holder
        assert not out.exists()
    # The holder was killed with SIGKILL: the kernel dropped its lock, and its stale lock file blocks no one.
    write_dataset(out, *tables())
    assert open_dataset(out).num_nodes == 6
    assert not lock_path(out).exists()


def test_the_lock_excludes_a_second_descriptor_and_other_threads_but_not_its_own_thread(tmp_path):
    out = tmp_path / "ds"
    with output_lock(out) as path:
        assert path == lock_path(out) and path.read_text() == f"{os.getpid()}\n"
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        errors = []

        def other_thread():
            try:
                with output_lock(out):
                    pass
            except OutputLocked as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert errors and f"pid {os.getpid()}" in errors[0]
        write_dataset(out, *tables())  # the holder itself may write (the lock is re-entrant in its thread)
    assert not path.exists()


# -- file records and verification -----------------------------------------------------------------


def _stage_dir(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = tmp_path / "subgraphs"
    (directory / "nested").mkdir(parents=True)
    np.save(directory / "node.npy", np.zeros((7, 3), np.float32))
    pq.write_table(pa.table({"x": [1, 2, 3]}), directory / "part-000000.parquet")
    (directory / "nested" / "info.json").write_text("{}")
    (directory / ".part-000001.parquet.tmp-1234").write_text("half")  # a writer's temporary: not an output
    return directory


def test_file_records_list_every_output_with_bytes_rows_and_checksum(tmp_path):
    from seeder.system.io import checksum_file, file_records

    directory = _stage_dir(tmp_path)
    records = file_records(directory)
    assert sorted(records) == ["nested/info.json", "node.npy", "part-000000.parquet"]
    assert records["node.npy"]["rows"] == 7 and records["part-000000.parquet"]["rows"] == 3
    assert records["nested/info.json"]["rows"] is None
    assert records["node.npy"]["bytes"] == (directory / "node.npy").stat().st_size
    assert records["node.npy"]["xxh3"] == checksum_file(directory / "node.npy")
    assert "xxh3" not in file_records(directory, checksum=False)["node.npy"]


def test_a_file_linked_from_a_recorded_directory_takes_over_its_checksum(tmp_path):
    """An update links its parent's unchanged files: their recorded checksums are taken over without
    reading them, but only for the same inode and size; a copy, or a file edited since, is read."""
    import shutil

    import numpy as np

    from seeder.system.io import checksum_file, file_records, write_manifest

    parent = _stage_dir(tmp_path)
    records = file_records(parent)
    records["node.npy"]["xxh3"] = "recorded"  # what only a taken-over record can carry
    records["part-000000.parquet"]["xxh3"] = "recorded"
    write_manifest(parent, {"files": records})
    child = tmp_path / "child"
    child.mkdir()
    os.link(parent / "node.npy", child / "node.npy")
    shutil.copy(parent / "part-000000.parquet", child / "part-000000.parquet")
    taken = file_records(child, linked_from=parent)
    assert taken["node.npy"]["xxh3"] == "recorded"
    assert taken["part-000000.parquet"]["xxh3"] == checksum_file(child / "part-000000.parquet")
    (child / "node.npy").unlink()
    np.save(child / "node.npy", np.ones((7, 3), np.float32))  # the same size, another inode
    assert file_records(child, linked_from=parent)["node.npy"]["xxh3"] == checksum_file(child / "node.npy")


def test_verify_outputs_names_each_missing_truncated_damaged_or_stray_file(tmp_path):
    from seeder.system.io import file_records, verify_outputs

    directory = _stage_dir(tmp_path)
    manifest = {"files": file_records(directory)}
    assert verify_outputs(directory, manifest, deep=True) == []
    (directory / "part-000000.parquet").unlink()
    with open(directory / "node.npy", "r+b") as fh:
        fh.truncate(100)
    (directory / "part-000009.parquet").write_bytes(b"stray")
    problems = verify_outputs(directory, manifest, deep=False)
    assert problems == [
        f"subgraphs/node.npy: size 100 != recorded {manifest['files']['node.npy']['bytes']} bytes",
        "subgraphs/part-000000.parquet: missing",
        "subgraphs/part-000009.parquet: not recorded in its manifest (a stray file)",
    ]
    # Same size, other bytes: only the deep check (checksums) sees it.
    (directory / "part-000009.parquet").unlink()
    (directory / "nested" / "info.json").write_text("[]")
    assert not any("info.json" in p for p in verify_outputs(directory, manifest, deep=False))
    assert [p for p in verify_outputs(directory, manifest, deep=True) if "info.json" in p][0].startswith(
        "subgraphs/nested/info.json: checksum "
    )
    assert verify_outputs(directory, {}, deep=False) == [
        "subgraphs/manifest.json: records no files (written before seeder verified its outputs)"
    ]
