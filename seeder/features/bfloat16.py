"""A bfloat16 copy of the node features for K-HOP's filter on large graphs.

K-HOP-WITH-FILTERING (paper, Section 3) reads one feature row per candidate, from all over the node
features. On a large graph an expansion worker therefore comes to map most of ``node.npy``: at ten
million nodes of 256 float32 features that is 10 GB in one process, and each row is 16 cache lines
fetched from memory. From ``reduce.bfloat16_from_nodes`` nodes up, the features stage also writes
``node_bf16.npy``: the same rows rounded to bfloat16 (float32's exponent, 8 significant bits), stored
as their uint16 bit patterns. The filter reads it instead: half the bytes mapped and fetched, and each
cosine within about 2^-8 of its float32 value, enough to rank candidates though near-ties may order
differently. Everything else (seeds, the policy, training) keeps reading the float32 rows.

bfloat16 widens to float32 by a shift (its bits are float32's upper half), so the compiled filter
converts each element as it reads it (``seeder.retrieve.khop_kernels``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from seeder.system.mapped import release

FILE_NAME = "node_bf16.npy"
"""The copy's file in the features stage directory, beside ``node.npy``."""

_CHUNK_ROWS = 1 << 18
"""Rows converted at a time: 256 MB of 256-wide float32 rows, so the copy streams at any graph size."""


def applies(num_nodes: int, from_nodes: int) -> bool:
    """Whether a graph of ``num_nodes`` gets the copy (``reduce.bfloat16_from_nodes``; 0 never)."""
    return from_nodes > 0 and num_nodes >= from_nodes


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even, as torch rounds.
    Features are finite, so NaN needs no care."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def write_copy(features_dir: str | Path) -> Path:
    """Write ``node_bf16.npy`` beside ``node.npy`` in ``features_dir``, a chunk of rows at a time, and
    let each chunk's pages go from this process (they stay in the page cache)."""
    features_dir = Path(features_dir)
    nodes = np.load(features_dir / "node.npy", mmap_mode="r")
    path = features_dir / FILE_NAME
    copy = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=nodes.shape)
    for lo in range(0, len(nodes), _CHUNK_ROWS):
        hi = min(lo + _CHUNK_ROWS, len(nodes))
        copy[lo:hi] = to_bfloat16_bits(nodes[lo:hi])
        release(nodes[lo:hi])
        release(copy[lo:hi])
    copy.flush()
    del copy
    return path


def written_copy(features_dir: str | Path) -> np.ndarray | None:
    """The features stage's bfloat16 copy, memory-mapped, or None where it wrote none."""
    copy = Path(features_dir) / FILE_NAME
    return np.load(copy, mmap_mode="r") if copy.exists() else None


def filter_features(features_dir: str | Path) -> np.ndarray:
    """The node rows K-HOP's filter reads from a features stage, memory-mapped: the bfloat16 copy where
    the stage wrote one, else ``node.npy``."""
    copy = written_copy(features_dir)
    return copy if copy is not None else np.load(Path(features_dir) / "node.npy", mmap_mode="r")
