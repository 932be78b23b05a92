"""Shared machinery of the baselines: inputs, dense top-k, batched ego graphs, group top-k, full rankings.

Every baseline works on a batch of queries at once. Per-query variable-size data (ego graphs, beams,
candidate sets) lives in flat arrays sorted by query position with a ``query`` column, so the work
around the few inherently sequential steps (pcst_fast, A*'s priority queue) stays vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from seeder.data.ragged import ranges
from seeder.data.store import build_csr
from seeder.retrieve.base import RetrievalResult, group_rank  # noqa: F401 (the baselines import it from here)
from seeder.retrieve.topk import dense_seeds as exact_topk
from seeder.system.io import DataError


class CSRGraph(Protocol):
    """What the baselines need of a graph; ``seeder.data.store.KnowledgeGraph`` satisfies it."""

    indptr: np.ndarray  # int64 [N+1]
    neighbors: np.ndarray  # int32 [2E]
    edge_relations: np.ndarray  # int32 [2E]; r for out-edges, r + R for in-edges

    @property
    def num_nodes(self) -> int: ...

    @property
    def num_relations(self) -> int: ...


@dataclass
class InMemoryGraph:
    """A CSR graph held in memory (tests, benchmarks); build it with ``from_edges``."""

    indptr: np.ndarray
    neighbors: np.ndarray
    edge_relations: np.ndarray
    num_nodes: int
    num_relations: int

    @classmethod
    def from_edges(cls, num_nodes: int, num_relations: int, src, dst, rel) -> "InMemoryGraph":
        src, dst, rel = (np.asarray(a, dtype=np.int64) for a in (src, dst, rel))
        indptr, neighbors, relations = build_csr(num_nodes, num_relations, src, dst, rel)
        return cls(indptr, neighbors, relations, num_nodes, num_relations)


@dataclass
class BaselineInputs:
    """Everything a baseline reads for one batch of queries.

    ``node_features`` [N, d], ``relation_features`` [2R, d] and ``query_features`` [Q, d] are
    L2-normalised (the preprocessing artifacts), so a dot product is a cosine.
    """

    graph: Any  # CSRGraph
    node_features: np.ndarray
    relation_features: np.ndarray
    query_ids: np.ndarray
    query_features: np.ndarray
    query_texts: list[str] | None = None
    node_texts: list[str] | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    """Per-dataset state a method builds once (the BM25 index), reused across batches."""
    dense_depth: int = 0
    """Depth of the dense ranking computed on first use (the ranking length), so seeding and the
    ranking's dense fill share one pass over the node features."""
    _dense: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def dense_ranking(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k nodes by cosine for these queries (ids, scores), computed once per batch."""
        if self._dense is None or self._dense[0].shape[1] < min(k, self.graph.num_nodes):
            self._dense = dense_topk(self.query_features, self.node_features, max(k, self.dense_depth))
        return self._dense[0][:, :k], self._dense[1][:, :k]

    def __post_init__(self) -> None:
        n, d = self.node_features.shape
        if n != self.graph.num_nodes:
            raise DataError(
                f"node_features has {n} rows but the graph has {self.graph.num_nodes} nodes; "
                "use the features built from this dataset"
            )
        if self.relation_features.shape != (2 * self.graph.num_relations, d):
            raise DataError(
                f"relation_features has shape {self.relation_features.shape}, expected "
                f"({2 * self.graph.num_relations}, {d}): one row per relation and per inverse relation"
            )
        if self.query_features.shape != (len(self.query_ids), d):
            raise DataError(f"query_features has shape {self.query_features.shape}, expected ({len(self.query_ids)}, {d})")
        if self.query_texts is not None and len(self.query_texts) != len(self.query_ids):
            raise DataError(f"{len(self.query_texts)} query texts for {len(self.query_ids)} query ids")

    def batch(self, rows: np.ndarray) -> "BaselineInputs":
        """The same inputs restricted to query rows ``rows`` (sharing the cache)."""
        texts = None if self.query_texts is None else [self.query_texts[i] for i in rows]
        return BaselineInputs(
            self.graph,
            self.node_features,
            self.relation_features,
            np.asarray(self.query_ids)[rows],
            np.asarray(self.query_features)[rows],
            texts,
            self.node_texts,
            self.cache,
        )

    @classmethod
    def from_artifacts(cls, artifacts, split: str | None = None, with_texts: bool = False) -> "BaselineInputs":
        """Inputs for the queries of ``split`` (all when None) from a preprocessing artifacts directory."""
        kg = artifacts.dataset
        queries = kg.queries if split is None else kg.queries_of(split)
        ids = queries.column("id").to_numpy()
        rows = artifacts.query_rows(ids)
        return cls(
            kg,
            artifacts.node_features,
            artifacts.relation_features,
            ids,
            np.asarray(artifacts.query_features[rows]),
            queries.column("text").to_pylist() if with_texts else None,
            kg.nodes.column("text").to_pylist() if with_texts else None,
        )


# ---------------------------------------------------------------------------------------------------
# Dense similarity


def dense_topk(
    query_features: np.ndarray, node_features: np.ndarray, k: int, block_nodes: int = 131_072
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k nodes by cosine per query, best first, ties by node id: (ids [Q,k], scores [Q,k]).

    The project's blocked kernel (``seeder.retrieve.seeds.dense_seeds``): memory stays at
    queries x ``block_nodes`` however large the graph is; k beyond N pads with -1.
    """
    return exact_topk(query_features, node_features, max(int(k), 1), block_nodes=block_nodes)


def pair_cosine(query_features: np.ndarray, query_pos: np.ndarray, vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """cos(q_i, v_j) for many (query position i, row j) pairs at once, chunked to bound memory."""
    out = np.empty(len(query_pos), dtype=np.float32)
    chunk = 1 << 18
    for s in range(0, len(query_pos), chunk):
        qp, rr = query_pos[s : s + chunk], rows[s : s + chunk]
        out[s : s + chunk] = np.einsum("ij,ij->i", query_features[qp], np.asarray(vectors[rr], dtype=np.float32))
    return out


# ---------------------------------------------------------------------------------------------------
# Grouped (per-query) operations on flat arrays


def group_topk(group: np.ndarray, score: np.ndarray, tiebreak: np.ndarray, k) -> np.ndarray:
    """Indices of the best ``k`` items of each group (k scalar or per-group array), in (group, rank) order."""
    order, rank = group_rank(group, score, tiebreak)
    limit = k if np.isscalar(k) else np.asarray(k)[group[order]]
    return order[rank < limit]


def dedupe_max(group: np.ndarray, item: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per (group, item) keeping the highest score; sorted by (group, item)."""
    order = np.lexsort((-score, item, group))
    g, it, sc = group[order], item[order], score[order]
    keep = np.r_[True, (g[1:] != g[:-1]) | (it[1:] != it[:-1])] if len(g) else np.zeros(0, dtype=bool)
    return g[keep], it[keep], sc[keep]


def csr_expand(graph, nodes: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``cap`` CSR entries of each node: (source index into ``nodes``, neighbour, relation id)."""
    indptr = graph.indptr
    start = np.asarray(indptr[nodes], dtype=np.int64)
    degree = np.minimum(np.asarray(indptr[nodes + 1], dtype=np.int64) - start, cap)
    owner = np.repeat(np.arange(len(nodes)), degree)
    positions = ranges(start, degree)
    return (
        owner,
        np.asarray(graph.neighbors[positions], dtype=np.int64),
        np.asarray(graph.edge_relations[positions], dtype=np.int64),
    )


# ---------------------------------------------------------------------------------------------------
# Bounded ego graphs, batched as a disjoint union


@dataclass
class EgoGraphs:
    """Ego graphs of Q queries as one disjoint union; nodes sorted by (query, node id).

    ``query[i]``/``node[i]``/``hop[i]``/``sim[i]``: flat node i belongs to query position ``query[i]``;
    ``offsets`` [Q+1] slices each query's nodes. Edges are directed base-relation triples
    (head, relation, tail) given as flat node indices, sorted by query, each once.
    """

    query: np.ndarray
    node: np.ndarray
    hop: np.ndarray
    sim: np.ndarray
    offsets: np.ndarray
    edge_head: np.ndarray
    edge_tail: np.ndarray
    edge_relation: np.ndarray
    edge_query: np.ndarray

    @property
    def num_queries(self) -> int:
        return len(self.offsets) - 1


def ego_graphs(inputs: BaselineInputs, seeds: np.ndarray, hops: int, neighbor_cap: int, max_nodes: int) -> EgoGraphs:
    """K-hop ego graphs around each query's seeds (``seeds`` [Q,k], -1 padded), bounded per query.

    Each hop follows at most ``neighbor_cap`` CSR entries per frontier node (both directions) and
    keeps the new nodes best by cosine while the query has fewer than ``max_nodes``; the edges are
    every base-relation edge among the kept nodes found within those capped CSR entries.
    """
    graph = inputs.graph
    n = int(graph.num_nodes)
    num_q = len(seeds)
    valid = seeds >= 0
    query = np.repeat(np.arange(num_q), valid.sum(1))
    node = seeds[valid].astype(np.int64)
    query, node, _ = dedupe_max(query, node, np.zeros(len(node), dtype=np.float32))
    hop = np.zeros(len(node), dtype=np.int64)
    keys = query * n + node  # sorted: dedupe_max returns (query, node) order
    frontier_q, frontier_n = query, node
    for h in range(1, hops + 1):
        if not len(frontier_n):
            break
        owner, nbr, _ = csr_expand(graph, frontier_n, neighbor_cap)
        cand_q = frontier_q[owner]
        cand_key = np.unique(cand_q * n + nbr)
        pos = np.searchsorted(keys, cand_key)
        seen = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == cand_key)
        cand_key = cand_key[~seen]
        cand_q, cand_n = cand_key // n, cand_key % n
        cand_sim = pair_cosine(inputs.query_features, cand_q, inputs.node_features, cand_n)
        room = np.maximum(max_nodes - np.bincount(query, minlength=num_q), 0)
        kept = group_topk(cand_q, cand_sim, cand_n, room)
        frontier_q, frontier_n = cand_q[kept], cand_n[kept]
        query = np.concatenate([query, frontier_q])
        node = np.concatenate([node, frontier_n])
        hop = np.concatenate([hop, np.full(len(kept), h, dtype=np.int64)])
        order = np.lexsort((node, query))
        query, node, hop = query[order], node[order], hop[order]
        keys = query * n + node
    sim = pair_cosine(inputs.query_features, query, inputs.node_features, node)
    offsets = np.searchsorted(query, np.arange(num_q + 1))

    # Induced edges: scan each kept node's capped CSR entries, keep those landing inside the same ego
    # graph, and write each as (head, base relation, tail) once whichever endpoint found it.
    owner, nbr, rel = csr_expand(graph, node, neighbor_cap)
    other_key = query[owner] * n + nbr
    pos = np.searchsorted(keys, other_key)
    inside = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == other_key)
    here, there, rel = owner[inside], pos[inside], rel[inside]
    r = int(graph.num_relations)
    inverse = rel >= r
    head = np.where(inverse, there, here)
    tail = np.where(inverse, here, there)
    base = np.where(inverse, rel - r, rel)
    triple = np.unique(np.stack([head, base, tail], axis=1), axis=0) if len(head) else np.zeros((0, 3), dtype=np.int64)
    head, base, tail = triple[:, 0], triple[:, 1], triple[:, 2]
    order = np.argsort(query[head], kind="stable")
    head, base, tail = head[order], base[order], tail[order]
    return EgoGraphs(query, node, hop, sim, offsets, head, tail, base, query[head])


# ---------------------------------------------------------------------------------------------------
# Full rankings


def first_occurrences(rows: np.ndarray) -> np.ndarray:
    """Each row of ``rows`` (int, -1 = empty) with repeats and -1 removed, order kept, -1 padded at the end."""
    q, width = rows.shape
    order = np.lexsort((np.broadcast_to(np.arange(width), rows.shape), rows), axis=1)
    sorted_vals = np.take_along_axis(rows, order, axis=1)
    dup_sorted = np.zeros_like(rows, dtype=bool)
    dup_sorted[:, 1:] = sorted_vals[:, 1:] == sorted_vals[:, :-1]
    drop = np.empty_like(dup_sorted)
    np.put_along_axis(drop, order, dup_sorted, axis=1)
    drop |= rows < 0
    compact = np.argsort(drop, axis=1, kind="stable")
    out = np.take_along_axis(rows, compact, axis=1)
    out[np.take_along_axis(drop, compact, axis=1)] = -1
    return out


def rank_candidates(num_queries: int, query: np.ndarray, node: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-query candidates best first (ties by node id), as a padded [Q, max count] array and counts."""
    query, node, score = dedupe_max(np.asarray(query, np.int64), np.asarray(node, np.int64), np.asarray(score, np.float64))
    order, rank = group_rank(query, score, node)
    counts = np.bincount(query, minlength=num_queries)
    width = int(counts.max(initial=0))
    out = np.full((num_queries, width), -1, dtype=np.int64)
    out[query[order], rank] = node[order]
    return out, counts


def full_ranking(inputs: BaselineInputs, method_ranking: np.ndarray, set_size: np.ndarray, length: int) -> RetrievalResult:
    """The method's nodes best first, then the other nodes by dense cosine, to ``length`` per query.

    ``method_ranking`` [Q, W] holds each query's own candidates best first (-1 padded), ``set_size``
    how many of them form its retrieved set (capped at ``length``).
    """
    length = min(length, int(inputs.graph.num_nodes))
    method_ranking = np.asarray(method_ranking, dtype=np.int64)
    dense_ids, _ = inputs.dense_ranking(length)
    own = first_occurrences(method_ranking)
    merged = first_occurrences(np.concatenate([own[:, :length], dense_ids], axis=1))[:, :length]
    sizes = np.minimum(np.asarray(set_size, dtype=np.int64), (own >= 0).sum(1))
    return RetrievalResult(np.asarray(inputs.query_ids, dtype=np.int64), merged, np.minimum(sizes, length))


def dense_seeds(inputs: BaselineInputs, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k nodes by cosine (the paper's dense seeding, Section 3) for every query of ``inputs``."""
    return inputs.dense_ranking(k)


def in_batches(inputs: BaselineInputs, block_queries: int, run, length: int = 0) -> RetrievalResult:
    """Apply ``run(batch) -> RetrievalResult`` to blocks of queries and concatenate (rankings padded)."""
    parts = []
    for start in range(0, len(inputs.query_ids), block_queries):
        batch = inputs.batch(np.arange(start, min(start + block_queries, len(inputs.query_ids))))
        batch.dense_depth = length
        parts.append(run(batch))
    if not parts:
        return RetrievalResult(np.zeros(0, np.int64), np.zeros((0, 0), np.int64), np.zeros(0, np.int64))
    width = max(p.ranking.shape[1] for p in parts)
    rankings = [np.pad(p.ranking, ((0, 0), (0, width - p.ranking.shape[1])), constant_values=-1) for p in parts]
    return RetrievalResult(
        np.concatenate([p.query_ids for p in parts]), np.concatenate(rankings), np.concatenate([p.set_size for p in parts])
    )
