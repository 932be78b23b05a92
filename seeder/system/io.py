"""Atomic directories, manifests, fingerprints and output locks shared by the store and every pipeline stage.

A directory counts as complete only once its ``manifest.json`` exists, and the manifest is written
last, inside a temporary sibling directory that is renamed into place. A killed writer therefore
leaves at most a ``*.partial-*`` directory, never something that looks complete.

Every writer of an output directory holds an exclusive lock on ``.NAME.lock`` beside it (``output_lock``),
so a second writer fails at once instead of racing the first one; and ``--overwrite`` replaces only what
this tool wrote (``check_replaceable``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import inspect
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow.parquet as pq
import xxhash

MANIFEST = "manifest.json"
# Manifest kinds of the directories this tool writes: the only non-empty ones --overwrite may replace.
OWNED_KINDS = ("seeder-dataset", "seeder-artifacts")


class DataError(ValueError):
    """Bad input data: the message names the file, the row or id, and the fix."""


def fingerprint_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (hex, first 16 chars are plenty to detect a change)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


CHECKSUM = "xxh3"  # the key of a file record's checksum: xxh3_64, hex (several GB/s, so verifying is cheap)


def checksum_file(path: str | Path, chunk: int = 1 << 23) -> str:
    """A fast checksum of a file's bytes (xxh3_64, hex): detects damaged or rewritten outputs. Not a
    fingerprint of content identity across tools (that is ``fingerprint_file``, sha256)."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def checksum_matches(path: Path, entry: dict[str, Any]) -> tuple[bool, str, str]:
    """(matches, found, recorded) for a file record's checksum; a record without one matches."""
    if entry.get(CHECKSUM):
        found = checksum_file(path)
        return found == entry[CHECKSUM], found, entry[CHECKSUM]
    if entry.get("sha256"):
        found = fingerprint_file(path)
        return found == entry["sha256"], found, entry["sha256"]
    return True, "", ""


def _rows(path: Path) -> int | None:
    """Rows of a Parquet file (its footer) or an ``.npy`` array (its header): cheap, no data read."""
    try:
        if path.suffix == ".parquet":
            return int(pq.ParquetFile(path).metadata.num_rows)
        if path.suffix == ".npy":
            with open(path, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape = read(fh)[0]
            return int(shape[0]) if shape else 1
    except Exception:  # unreadable: the checksum and the size still record it
        return None
    return None


def _data_files(directory: Path) -> list[Path]:
    """The files a stage wrote: everything under ``directory`` except its manifest and hidden names
    (temporary files, the partial-directory key)."""
    out = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and rel.as_posix() != MANIFEST and not any(part.startswith(".") for part in rel.parts):
            out.append(path)
    return out


def file_records(
    directory: str | Path, checksum: bool = True, linked_from: str | Path | None = None
) -> dict[str, dict[str, Any]]:
    """What ``directory`` holds, for its manifest: ``{relative path: {"bytes", "xxh3", "rows"}}``.

    ``xxh3`` is the file's checksum (``checksum_file``; left out when ``checksum`` is false), ``rows``
    the row count of a Parquet file or ``.npy`` array (None for others). A file that is a hard link of
    the file at the same path under ``linked_from`` (one inode, so one content) takes over the checksum
    that directory's manifest records for it: an update links its parent's unchanged files, gigabytes
    at a million nodes, and need not read them again.
    """
    directory = Path(directory)
    known = (read_manifest(linked_from) or {}).get("files", {}) if linked_from is not None else {}
    records = {}
    for path in _data_files(directory):
        rel = path.relative_to(directory).as_posix()
        stat = path.stat()
        entry: dict[str, Any] = {"bytes": stat.st_size, "rows": _rows(path)}
        if checksum:
            record = known.get(rel) or {}
            if CHECKSUM in record and record.get("bytes") == stat.st_size and _same_inode(stat, Path(linked_from) / rel):
                entry[CHECKSUM] = record[CHECKSUM]
            else:
                entry[CHECKSUM] = checksum_file(path)
        records[rel] = entry
    return records


def _same_inode(stat: os.stat_result, other: Path) -> bool:
    try:
        theirs = other.stat()
    except OSError:
        return False
    return (stat.st_dev, stat.st_ino) == (theirs.st_dev, theirs.st_ino)


def verify_outputs(directory: str | Path, manifest: dict[str, Any], deep: bool = False, prefix: str | None = None) -> list[str]:
    """Problems of ``directory`` against the files its ``manifest`` records (``file_records``), one
    line each, e.g. ``subgraphs/part-000003.parquet: missing``; empty when everything matches.

    Cheap (``deep=False``): every recorded file exists with its recorded size and no other data file
    is there (a few ``stat`` calls). Deep: also each file's checksum (reads every byte). Lines name files as ``prefix/relative`` (``prefix``
    defaults to the directory's name). A manifest without records gets one line saying so.
    """
    directory = Path(directory)
    prefix = directory.name if prefix is None else prefix
    name = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
    records = manifest.get("files")
    if not isinstance(records, dict):
        return [f"{name(MANIFEST)}: records no files (written before seeder verified its outputs)"]
    problems = []
    for rel, entry in sorted(records.items()):
        path = directory / rel
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{name(rel)}: missing")
            continue
        if size != entry.get("bytes"):
            problems.append(f"{name(rel)}: size {size} != recorded {entry.get('bytes')} bytes")
        elif deep:
            same, found, recorded = checksum_matches(path, entry)
            if not same:
                problems.append(f"{name(rel)}: checksum {found} != recorded {recorded} (damaged)")
    if directory.is_dir():
        for path in _data_files(directory):
            rel = path.relative_to(directory).as_posix()
            if rel not in records:
                problems.append(f"{name(rel)}: not recorded in its manifest (a stray file)")
    return problems


def fingerprint_json(obj: Any) -> str:
    """Stable fingerprint of a JSON-serialisable object (configs, lists of input fingerprints)."""
    data = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def write_manifest(directory: str | Path, manifest: dict[str, Any]) -> None:
    path = Path(directory) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The manifest of a complete directory, or None when the directory is absent or incomplete."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _manifest_kind(directory: Path) -> str | None:
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):  # unreadable or not JSON: not a manifest we wrote
        return None
    return manifest.get("kind") if isinstance(manifest, dict) else None


def check_replaceable(target: str | Path, overwrite: bool, marker: str | None = None) -> None:
    """Refuse to write ``target`` unless it is absent, or ``overwrite`` is set and it is ours to replace.

    Ours: an empty directory, a directory whose manifest has one of ``OWNED_KINDS``, or one holding
    ``marker`` (a file only this tool's writer of that kind of directory creates). Anything else is
    left untouched: a mistyped ``--out`` must never delete a user's folder.
    """
    target = Path(target)
    if not target.exists() and not target.is_symlink():
        return
    if not overwrite:
        raise FileExistsError(f"{target} already exists; choose another --out or pass --overwrite")
    if target.is_symlink() or not target.is_dir():
        what = "a symbolic link" if target.is_symlink() else "a file, not a directory"
        raise DataError(
            f"{target}: is {what}, so it is left untouched rather than replaced; remove it yourself or choose another --out"
        )
    if next(target.iterdir(), None) is None:
        return
    if _manifest_kind(target) in OWNED_KINDS or (marker is not None and (target / marker).is_file()):
        return
    what = f"{MANIFEST} of kind {' or '.join(OWNED_KINDS)}" + (f", nor {marker}" if marker else "")
    raise DataError(
        f"{target}: not a directory this tool wrote (it has no {what}), so it is left untouched rather than "
        f"replaced; remove it yourself or choose another --out"
    )


def lock_path(target: str | Path) -> Path:
    """The lock file of output directory ``target``: beside it, since the directory itself is replaced by a rename."""
    target = Path(os.path.abspath(target))
    return target.parent / f".{target.name}.lock"


class OutputLocked(DataError):
    """Another process (or thread) is writing the same output directory."""


_held: dict[Path, list] = {}  # lock file -> [fd, owning thread id, depth]
_held_guard = threading.Lock()


def _holder(path: Path) -> str:
    # The holder writes its pid right after it takes the lock: wait briefly for an empty file to fill.
    for _ in range(20):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text:
            return f"process {text}"
        time.sleep(0.05)
    return "another process"


@contextlib.contextmanager
def output_lock(target: str | Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``target``'s lock file (holding this process's pid) while the block runs.

    A second writer fails at once with ``OutputLocked`` naming the holder's pid. The kernel drops the
    lock when the holder exits, kill -9 included, so a stale lock file never blocks anyone. Re-entrant
    within one thread, so a function that holds the lock may call another that takes it.
    """
    path = lock_path(target)
    me = threading.get_ident()
    with _held_guard:
        entry = _held.get(path)
        if entry is not None and entry[1] == me:
            entry[2] += 1
            reentered = True
        elif entry is not None:
            raise OutputLocked(f"{target} is being written by another thread of this process (pid {os.getpid()})")
        else:
            reentered = False
    if reentered:
        try:
            yield path
        finally:
            with _held_guard:
                _held[path][2] -= 1
        return

    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise OutputLocked(
                f"{target} is being written by {_holder(path)} (it holds {path}); wait for it to finish or choose another --out"
            ) from None
        # A releasing holder unlinks the file: a lock on an unlinked inode guards nothing, so start over.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    with _held_guard:
        _held[path] = [fd, me, 1]
    try:
        yield path
    finally:
        with _held_guard:
            del _held[path]
        # Unlink before unlocking, so no one can lock this inode after we are done with it.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def writes_output(func: Callable) -> Callable:
    """Decorate a writer whose arguments include ``out`` (and optionally ``overwrite``): it runs under
    ``output_lock(out)`` after ``check_replaceable``, so a busy or foreign ``--out`` fails before any work."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        out = bound.arguments["out"]
        with output_lock(out):
            check_replaceable(out, bool(bound.arguments.get("overwrite", False)))
            return func(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def atomic_directory(target: str | Path, overwrite: bool = False, marker: str | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``target`` when the block exits cleanly.

    The caller writes everything, the manifest last. On an exception the temporary directory is
    removed and ``target`` is left as it was. The whole write holds ``output_lock(target)``, and an
    existing ``target`` is replaced only when ``check_replaceable`` allows it (``marker``: see there).
    """
    target = Path(target)
    with output_lock(target):
        check_replaceable(target, overwrite, marker)
        target.parent.mkdir(parents=True, exist_ok=True)
        # What a writer killed with SIGKILL left: it held this lock, so no live writer owns these.
        for stale in [*target.parent.glob(f".{target.name}.partial-*"), *target.parent.glob(f".{target.name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp = target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if target.exists():
            trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, trash)
            os.replace(tmp, target)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, target)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
