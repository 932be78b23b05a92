"""Tiny knowledge graphs with random normalised features, built with the real store writer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seeder.data.store import open_dataset, write_dataset


def fixed_prior(vocab, num_relation_ids: int, input_dim: int, logits=None, **options):
    """A relation-path prior whose MLP reads ``input_dim`` columns and ignores them: every question gets
    softmax(``logits``) over ``vocab`` (uniform when None) before the prior's own masks and parts.
    ``options`` are further ``RelationPathPrior`` fields (``model``, ``wording_dim``, ...)."""
    from seeder.retrieve.prior import RelationPathPrior

    vocab = np.asarray(vocab, np.int64)
    hidden = 2
    return RelationPathPrior(
        w1=np.zeros((input_dim, hidden), np.float32),
        b1=np.zeros(hidden, np.float32),
        w2=np.zeros((hidden, len(vocab)), np.float32),
        b2=np.zeros(len(vocab), np.float32) if logits is None else np.asarray(logits, np.float32),
        vocab=vocab,
        num_relation_ids=num_relation_ids,
        info={},
        **options,
    )


def normalised(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_graph(path, src, dst, rel, num_nodes, num_relations, names=None, queries=None):
    """Write a dataset with the given edges; queries default to one val query answered by node 0."""
    names = names or [f"node {i}" for i in range(num_nodes)]
    nodes = pa.table({"id": np.arange(num_nodes), "type": ["entity"] * num_nodes, "name": names, "text": names})
    relations = pa.table(
        {
            "id": np.arange(num_relations, dtype=np.int32),
            "name": [f"r{i}" for i in range(num_relations)],
            "text": [f"relation {i}" for i in range(num_relations)],
            "inverse_text": [f"inverse relation {i}" for i in range(num_relations)],
        }
    )
    edges = pa.table({"src": np.asarray(src, np.int64), "dst": np.asarray(dst, np.int64), "relation": np.asarray(rel, np.int32)})
    if queries is None:
        queries = pa.table({"id": [0], "text": ["what is node 0"], "answers": [[0]], "split": ["val"]})
    return open_dataset(write_dataset(path, nodes, relations, edges, queries))


@pytest.fixture
def random_graph(tmp_path):
    """60 nodes, 240 random edges (duplicates and self-loops possible), 3 relations, two hubs."""
    rng = np.random.default_rng(7)
    n, r = 60, 3
    src = rng.integers(0, n, 240)
    dst = rng.integers(0, n, 240)
    # Two hubs wired to most nodes, and to each other in both directions.
    src = np.concatenate([src, np.full(40, 5), rng.integers(0, n, 30), [5, 9]])
    dst = np.concatenate([dst, rng.integers(0, n, 40), np.full(30, 9), [9, 5]])
    rel = rng.integers(0, r, len(src))
    kg = make_graph(tmp_path / "kg", src, dst, rel, n, r)
    return kg, (src, dst, rel), rng
