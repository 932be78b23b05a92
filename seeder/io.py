"""Atomic directories, manifests and fingerprints shared by the store and every pipeline stage.

A directory counts as complete only once its ``manifest.json`` exists, and the manifest is written
last, inside a temporary sibling directory that is renamed into place. A killed writer therefore
leaves at most a ``*.partial-*`` directory, never something that looks complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

MANIFEST = "manifest.json"


class DataError(ValueError):
    """Bad input data: the message names the file, the row or id, and the fix."""


def fingerprint_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (hex, first 16 chars are plenty to detect a change)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


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


@contextlib.contextmanager
def atomic_directory(target: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``target`` when the block exits cleanly.

    The caller writes everything, the manifest last. On an exception the temporary directory is
    removed and ``target`` is left as it was.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; choose another --out or pass --overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
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
