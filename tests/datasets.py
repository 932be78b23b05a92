"""Tiny datasets shared by the end-to-end tests (preprocess, benchmark): written through the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from seeder.store import write_dataset


def write_tiny_dataset(directory: Path, num_queries: int, seed: int, two_hop_answers: bool, id_stride: int) -> Path:
    """300 nodes with plain-text names, 1,500 random edges over 4 relations, and ``num_queries`` queries
    ("what is related to <name>") spread over train / val / test with a ``hop`` attribute (1, 2, 1, ...).

    Answers are graph neighbours of the named entity, so a good subgraph can contain them: the first
    out-neighbour, or with ``two_hop_answers`` up to three nodes at the query's hop count. Query ids are
    ``i * id_stride + 2``: not contiguous, since ids are kept and never assumed to be row numbers.
    """
    rng = np.random.default_rng(seed)
    n, e, r = 300, 1500, 4
    names = [f"entity {i} {['red', 'blue', 'green', 'tall', 'old'][i % 5]}" for i in range(n)]
    nodes = pa.table({"id": np.arange(n), "type": ["thing"] * n, "name": names, "text": names})
    relations = pa.table({
        "id": np.arange(r, dtype=np.int32), "name": [f"rel{i}" for i in range(r)],
        "text": [f"relation {i}" for i in range(r)], "inverse_text": [f"inverse of relation {i}" for i in range(r)],
    })
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    edges = pa.table({"src": src, "dst": dst, "relation": rng.integers(0, r, e).astype(np.int32)})
    topic = rng.integers(0, n, num_queries)
    hop = (np.arange(num_queries) % 2 + 1).astype(np.int64)
    successors = [dst[src == i] for i in range(n)]  # test data only: 300 small lists
    if two_hop_answers:
        answers = []
        for t, h in zip(topic.tolist(), hop.tolist()):
            reach = set(successors[t].tolist())
            if h == 2:
                reach = set(np.concatenate([successors[v] for v in reach]).tolist()) if reach else set()
            answers.append(sorted(reach)[:3] or [t])
    else:
        answers = [[int(successors[t][0])] if len(successors[t]) else [int(t)] for t in topic]
    queries = pa.table({
        "id": np.arange(num_queries) * id_stride + 2,
        "text": [f"what is related to {names[t]}" for t in topic],
        "answers": answers,
        "split": np.array(["train", "val", "test"])[np.arange(num_queries) % 3],
        "hop": hop,
    })
    return write_dataset(directory, nodes, relations, edges, queries)
