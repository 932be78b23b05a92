"""Local paths or remote URIs (``s3://``, ``gs://``, ``file://``, ...) for every input and output directory.

Stages read memory-mapped arrays and write with atomic renames, which need a local filesystem. So a
remote directory is *fetched* into a local cache before it is read, and an output directory is written
locally and *published* afterwards. Publishing keeps the store's completeness rule on object stores,
which have no rename: the old manifest is deleted first, every other file is uploaded, and the manifest
goes up last. A reader that sees a manifest therefore sees a complete directory.

URIs are resolved by ``pyarrow.fs.FileSystem.from_uri``, so query parameters such as
``s3://bucket/prefix?endpoint_override=http://127.0.0.1:9000&scheme=http`` work for S3-compatible
servers, and credentials come from the usual environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from seeder.system.io import MANIFEST, DataError

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(path: str | os.PathLike) -> bool:
    """True for ``scheme://...`` strings (``file://`` included); False for plain local paths."""
    return bool(_SCHEME.match(str(path)))


def basename(path: str | os.PathLike) -> str:
    """The last name of a directory path or URI, without a URI's query: ``s3://b/x/art?endpoint_override=...`` -> ``art``."""
    if not is_uri(path):
        return Path(path).resolve().name
    return urlsplit(str(path)).path.rstrip("/").rsplit("/", 1)[-1]


def cache_root() -> Path:
    """Where fetched remote directories live (``SEEDER_CACHE``, default ``~/.cache/seeder``)."""
    return Path(os.environ.get("SEEDER_CACHE", Path.home() / ".cache" / "seeder"))


def join(uri: str, *parts: str) -> str:
    """Append path parts to a URI, keeping its query string (endpoint options) intact."""
    if not is_uri(uri):
        return str(Path(uri, *parts))
    split = urlsplit(uri)
    path = "/".join([split.path.rstrip("/"), *[p.strip("/") for p in parts]])
    return urlunsplit((split.scheme, split.netloc, path, split.query, split.fragment))


def filesystem(location: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path within it of a local path or a URI (``s3://``, ``gs://``, ``file://``)."""
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(location)
    uri = str(location)
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{uri}: not a usable storage URI ({exc}); use a local path, file://, s3:// or gs://") from None


def _read_remote_manifest(fs: pafs.FileSystem, root: str) -> dict | None:
    info = fs.get_file_info(f"{root}/{MANIFEST}")
    if info.type != pafs.FileType.File:
        return None
    with fs.open_input_stream(f"{root}/{MANIFEST}") as fh:
        return json.loads(fh.read().decode())


def fetch(path: str | os.PathLike) -> Path:
    """A local directory with the content of ``path``: the path itself when local, else a cached copy.

    A remote directory without a manifest is incomplete and is refused. The cache is reused while the
    remote manifest is unchanged.
    """
    if not is_uri(path):
        return Path(path)
    uri = str(path)
    fs, root = filesystem(uri)
    manifest = _read_remote_manifest(fs, root)
    if manifest is None:
        raise DataError(f"{uri}: no {MANIFEST} there (missing, or an upload that did not finish); publish it again")
    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    local = cache_root() / key
    cached = local / MANIFEST
    # Several processes of one node (a Ray worker per block) fetch the same directory at once: one
    # copies, the others wait and then find it cached, instead of replacing it under each other.
    with _cache_lock(key):
        if cached.is_file() and json.loads(cached.read_text()) == manifest:
            return local
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=_ensure(cache_root())))
        try:
            pafs.copy_files(root, str(tmp), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
            if json.loads((tmp / MANIFEST).read_text()) != manifest:
                raise DataError(f"{uri}: its manifest changed while it was being fetched; try again")
            shutil.rmtree(local, ignore_errors=True)
            os.replace(tmp, local)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return local


@contextlib.contextmanager
def _cache_lock(key: str) -> Iterator[None]:
    """An exclusive lock on one cache entry, held by this process until the block ends (released by
    the kernel if the process dies)."""
    lock_dir = _ensure(cache_root() / ".locks")
    with open(lock_dir / key, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def publish(local_dir: str | os.PathLike, uri: str) -> None:
    """Upload a complete local directory to ``uri``, manifest last (see the module docstring)."""
    local_dir = Path(local_dir)
    if not (local_dir / MANIFEST).is_file():
        raise DataError(f"{local_dir}: not complete (no {MANIFEST}); nothing was published to {uri}")
    fs, root = filesystem(uri)
    local = pafs.LocalFileSystem()
    if fs.get_file_info(f"{root}/{MANIFEST}").type == pafs.FileType.File:
        fs.delete_file(f"{root}/{MANIFEST}")
    fs.create_dir(root, recursive=True)
    top_manifest = local_dir / MANIFEST
    # A subdirectory with a manifest of its own that is already published as it is here (a stage that
    # preprocessing shared as it finished) is not uploaded twice.
    unchanged = [
        sub
        for sub in local_dir.iterdir()
        if sub.is_dir()
        and (sub / MANIFEST).is_file()
        and _read_remote_manifest(fs, f"{root}/{sub.name}") == json.loads((sub / MANIFEST).read_text())
    ]
    for file in sorted(
        p
        for p in local_dir.rglob("*")
        if p.is_file() and p != top_manifest and not any(p.is_relative_to(sub) for sub in unchanged)
    ):
        rel = file.relative_to(local_dir).as_posix()
        fs.create_dir(f"{root}/{rel}".rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(file), f"{root}/{rel}", source_filesystem=local, destination_filesystem=fs)
    pafs.copy_files(str(top_manifest), f"{root}/{MANIFEST}", source_filesystem=local, destination_filesystem=fs)


def published_manifest(uri: str) -> dict | None:
    """The manifest published at ``uri``, or None when nothing complete is there."""
    fs, root = filesystem(uri)
    return _read_remote_manifest(fs, root)


def retract(uri: str) -> None:
    """Delete the manifest at ``uri``, so that a directory about to change no longer looks complete
    (its files stay: a later ``publish`` overwrites them and puts the manifest back last)."""
    fs, root = filesystem(uri)
    if fs.get_file_info(f"{root}/{MANIFEST}").type == pafs.FileType.File:
        fs.delete_file(f"{root}/{MANIFEST}")


def read_parquet(path: str | os.PathLike):
    """One Parquet file, local or under a URI, read in place (no cache: a task that needs one shard of
    a large stage reads only that shard)."""
    if not is_uri(path):
        return pq.read_table(path)
    fs, file = filesystem(str(path))
    return pq.read_table(file, filesystem=fs)


@contextlib.contextmanager
def output_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield the local directory a stage writes into; a remote ``path`` is published when the block ends.

    For a local path this is the path itself. For a URI it is a local staging directory, seeded with
    what is already published there (so a resumed run skips finished stages) and uploaded on success.
    """
    if not is_uri(path):
        yield Path(path)
        return
    uri = str(path)
    fs, root = filesystem(uri)
    staging = cache_root() / "outputs" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if _read_remote_manifest(fs, root) is not None and not staging.exists():
        shutil.copytree(fetch(uri), staging)
    _ensure(staging)
    yield staging
    publish(staging, uri)
