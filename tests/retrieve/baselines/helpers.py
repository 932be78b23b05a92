"""Small graphs with controlled features for the baseline tests."""

from __future__ import annotations

import numpy as np

from seeder.config import BaselinesConfig, from_dict
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph


def normalised(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def with_cosines(cosines, dim: int = 8, relation_count: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query e0, node i with cosine ``cosines[i]`` to it (distinct orthogonal parts), relations orthogonal to it."""
    cosines = np.asarray(cosines, dtype=np.float64)
    n = len(cosines)
    nodes = np.zeros((n, dim + n))
    nodes[:, 0] = cosines
    nodes[np.arange(n), 1 + np.arange(n)] = np.sqrt(1 - cosines**2)
    query = np.zeros((1, dim + n))
    query[0, 0] = 1.0
    relations = np.zeros((2 * relation_count, dim + n))
    relations[:, -1] = 1.0
    return nodes.astype(np.float32), relations.astype(np.float32), query.astype(np.float32)


def random_inputs(seed: int = 0, n: int = 300, r: int = 4, e: int = 1200, d: int = 16, q: int = 9, texts: bool = True):
    rng = np.random.default_rng(seed)
    src, dst, rel = rng.integers(0, n, e), rng.integers(0, n, e), rng.integers(0, r, e)
    # A hub, so neighbour caps matter.
    src = np.concatenate([src, np.full(150, 3)])
    dst = np.concatenate([dst, rng.integers(0, n, 150)])
    rel = np.concatenate([rel, rng.integers(0, r, 150)])
    graph = InMemoryGraph.from_edges(n, r, src, dst, rel)
    words = np.array(["actor", "film", "director", "year", "genre", "writer", "language", "award", "city"])
    node_texts = [" ".join(rng.choice(words, 3)) + f" n{i}" for i in range(n)] if texts else None
    query_texts = [" ".join(rng.choice(words, 2)) for _ in range(q)] if texts else None
    return BaselineInputs(
        graph,
        normalised(rng, n, d),
        normalised(rng, 2 * r, d),
        np.arange(q, dtype=np.int64) * 7 + 1,
        normalised(rng, q, d),
        query_texts,
        node_texts,
    )


def baselines_config(**values) -> BaselinesConfig:
    """A BaselinesConfig from keys whose sub-section is written with ``__``: ``ego__max_nodes=80`` sets
    ``baselines.ego.max_nodes``."""
    nested: dict = {}
    for key, value in values.items():
        section, _, name = key.rpartition("__")
        (nested.setdefault(section, {}) if section else nested)[name] = value
    return from_dict(BaselinesConfig, nested)
