"""Ragged arrays: many lists of different lengths held as one flat array and CSR offsets.

A batch of a query's subgraph nodes, a node's neighbours or a question's seeds is stored flat, with
``ptr`` [n + 1] where list ``i`` is ``flat[ptr[i]:ptr[i + 1]]``. These helpers do the index arithmetic
between the two views for every stage, so that no hot path loops over the lists in Python.
"""

from __future__ import annotations

import numpy as np


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """CSR offsets of lists of these lengths: [0, l0, l0+l1, ...] (int64)."""
    ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return ptr


def segment_ids(ptr: np.ndarray) -> np.ndarray:
    """For offsets ``ptr`` of n lists, the list index of every flat element."""
    return np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))


def positions_within(lengths: np.ndarray) -> np.ndarray:
    """For consecutive lists of these lengths, each flat element's position inside its own list:
    lengths [2, 3] -> [0, 1, 0, 1, 2]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets_of(lengths)[:-1], lengths)


def run_positions(sorted_keys: np.ndarray) -> np.ndarray:
    """Each element's position inside its run of equal values (``sorted_keys`` grouped, e.g. sorted):
    [5, 5, 7, 9, 9, 9] -> [0, 1, 0, 0, 1, 2]."""
    n = len(sorted_keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    return positions_within(np.diff(np.r_[starts, n]))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + l)`` for each (start, length): the flat positions of
    slices of another flat array (a CSR row per node, a list per query)."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    return np.repeat(starts, lengths) + positions_within(lengths)
