"""Importers: turn a source's files into the store's four tables and write them with ``write_dataset``.

One module per source (``stark``, ``metaqa``, ``triples``, ``rdf``); this module holds what they share: strict
UTF-8 reading that names the file and line of a bad byte, a stable string hash for deterministic
splits, and string -> id lookups over Arrow arrays.
"""

from __future__ import annotations

import codecs
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.system.io import DataError

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def progress(message: str) -> None:
    """One progress or summary line on stderr (stdout stays free for machine-readable output)."""
    print(message, file=sys.stderr, flush=True)


def check_utf8(path: str | Path, chunk_size: int = 1 << 22) -> None:
    """Raise DataError naming ``path`` and the 1-based line of the first byte that is not UTF-8.

    Streams the file with an incremental decoder, so memory stays bounded for large inputs.
    """
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines_before = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk_size)
            final = not block
            try:
                decoder.decode(block, final=final)
            except UnicodeDecodeError as exc:
                # exc.start indexes the pending bytes + this block; pending bytes hold no newline.
                pending = len(exc.object) - len(block)
                offset = max(exc.start - pending, 0)
                line = lines_before + block[:offset].count(b"\n") + 1
                raise DataError(
                    f"{path}: line {line} is not valid UTF-8 ({exc.reason} at byte "
                    f"{exc.object[exc.start : exc.start + 1]!r}); re-encode the file as UTF-8 "
                    f"(e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if final:
                return
            lines_before += block.count(b"\n")


def require_file(path: str | Path) -> Path:
    """``path`` as a Path when it is a regular file; otherwise a DataError that says what it is instead."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a file")
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: is not a regular file (a device, socket or pipe), expected a file")
    return path


def read_lines(path: str | Path) -> pa.Array:
    """The lines of a UTF-8 text file as an Arrow string array (no BOM, no trailing empty line, no ``\\r``)."""
    path = require_file(path)
    check_utf8(path)
    # utf-8-sig: editors on Windows start files with a BOM, which would otherwise become part of the
    # first entity's name (a second node '\ufeffKismet' beside 'Kismet').
    text = path.read_text(encoding="utf-8-sig")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    arr = pa.array(lines, type=pa.string())
    return pc.utf8_rtrim(arr, characters="\r")


def stable_hash(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes, vectorised over strings (loops over byte positions).

    Stable across runs, machines and library versions, unlike Python's ``hash``: the split of a
    query never changes as long as its text does not.
    """
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    strings = strings.cast(pa.large_string()).fill_null("")
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int64)[strings.offset : strings.offset + len(strings) + 1]
    data = np.frombuffer(strings.buffers()[2], dtype=np.uint8) if strings.buffers()[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = np.full(len(strings), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for pos in range(int(lengths.max(initial=0))):
            live = np.flatnonzero(lengths > pos)
            h[live] = (h[live] ^ data[starts[live] + pos].astype(np.uint64)) * _FNV_PRIME
    return h


def hash_fraction(strings: pa.Array | pa.ChunkedArray, salt: str = "") -> np.ndarray:
    """A deterministic number in [0, 1) per string (the string's hash, salted so splits can be reshuffled)."""
    if salt:
        strings = pc.binary_join_element_wise(pa.scalar(salt), strings, "\x1f")
    # FNV-1a mixes the last bytes poorly into the top bits ("question 17" vs "question 18"), so
    # finish with MurmurHash3's 64-bit avalanche before taking the top 53 bits.
    h = stable_hash(strings)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def hash_split(strings: pa.Array | pa.ChunkedArray, val_fraction: float, test_fraction: float = 0.0) -> pa.Array:
    """train / val / test by a stable hash of each string: identical strings always land together."""
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise DataError(f"split fractions val={val_fraction}, test={test_fraction} must be >= 0 and sum below 1")
    u = hash_fraction(strings)
    split = np.where(u < test_fraction, "test", np.where(u < test_fraction + val_fraction, "val", "train"))
    return pa.array(split, type=pa.string())


def lookup(keys: pa.Array | pa.ChunkedArray, values: pa.Array) -> np.ndarray:
    """Position of each key in ``values`` (int64), -1 where absent."""
    idx = pc.index_in(keys, value_set=values)
    return idx.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)


def first_examples(items, limit: int = 5) -> str:
    return ", ".join(str(x) for x in list(items)[:limit])
