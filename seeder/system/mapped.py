"""Drop a memory-mapped range's pages from this process, keeping them in the page cache.

A process that streams a memory-mapped array (the exact seed search reads every node's features, the
features stage writes them) keeps every page it touched mapped, and they all count in its resident
set: at ten million nodes of 256 float32 features, 10 GB in each reader, though the kernel holds the
file once for every process and may drop clean pages under pressure. ``release`` unmaps the pages
under a view once the reader is done with them (``madvise(MADV_DONTNEED)``). On a shared file mapping
that loses nothing: the data stays in the page cache (written pages too, until written back), and a
later read faults the page in again from there.

Only shared file mappings are released: on anonymous or copy-on-write memory the same call would
discard the contents, so anything else is left alone.

Rows read at random hold more than their own pages: the kernel maps the cached pages around each fault
too, so a small random sample of a file's rows maps nearly the whole file (tests/system/test_mapped.py
shows it). ``take_rows`` gathers rows a stretch of the file at a time and releases each stretch.

A long-lived reader with scattered reads (an expansion worker reads node rows from all over the
features) lets go only once a mapping holds more than a budget, between blocks of work rather than
after every read: ``resident_bytes`` measures one mapping (it walks ``/proc/self/smaps``).
``file_resident_bytes``, the process's file-backed resident total from ``/proc/self/status``, is the
cheap whole-process figure the tests read.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import numpy as np

SHARED_MODES = ("r", "r+", "w+")
"""``np.memmap`` modes that map the file shared (``c`` is a private, copy-on-write mapping)."""


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def resident_bytes(view: np.ndarray) -> int | None:
    """Bytes of the file mapping under ``view`` resident in this process (the ``Rss`` of its mapping in
    ``/proc/self/smaps``); None where that is unknown (not Linux, not a memmap)."""
    if not sys.platform.startswith("linux") or not isinstance(view, np.memmap) or view.nbytes == 0:
        return None
    address = view.ctypes.data
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                if not inside:
                    # A mapping's header: "start-end perms offset dev inode path".
                    span = line.split(" ", 1)[0]
                    if "-" in span and ":" not in span:
                        low, _, high = span.partition("-")
                        try:
                            inside = int(low, 16) <= address < int(high, 16)
                        except ValueError:
                            inside = False
                elif line.startswith("Rss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def take_rows(array: np.ndarray, rows: np.ndarray, span_bytes: int = 256 << 20) -> np.ndarray:
    """``array[rows]`` as a new array; from a shared memmap, read one ``span_bytes`` stretch of the file
    at a time (rows in ascending order), each stretch released once its rows are copied, so that the
    process never holds more than one stretch of the mapping however the rows are spread."""
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(array, np.memmap) or array.mode not in SHARED_MODES or len(rows) == 0 or array.ndim == 0:
        return np.array(array[rows])
    order = np.argsort(rows, kind="stable")
    ascending = rows[order]
    per_span = max(int(span_bytes) // max(int(array.strides[0]), 1), 1)
    stretch = ascending // per_span
    bounds = np.flatnonzero(np.r_[True, stretch[1:] != stretch[:-1], True])
    out = np.empty((len(rows),) + array.shape[1:], dtype=array.dtype)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # one pass per stretch, not per row
        out[order[lo:hi]] = array[ascending[lo:hi]]
        release(array[ascending[lo] : ascending[hi - 1] + 1])
    return out


def file_resident_bytes() -> int | None:
    """Bytes of file-backed pages resident in this process (``RssFile`` of ``/proc/self/status``: every
    file mapping together, libraries included); None where that is unknown (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def release(view: np.ndarray) -> bool:
    """Unmap the pages under ``view`` (a slice of an ``np.memmap`` opened shared) from this process;
    whether it did. Partial pages at either end go too: a later access faults them back in."""
    madvise = _madvise()
    if (
        madvise is None
        or not isinstance(view, np.memmap)
        or getattr(view, "_mmap", None) is None
        or view.mode not in SHARED_MODES
        or view.nbytes == 0
        or not view.flags.contiguous
    ):
        return False
    start = view.ctypes.data
    aligned = start - start % mmap.PAGESIZE
    return madvise(aligned, start + view.nbytes - aligned, mmap.MADV_DONTNEED) == 0
