"""The approximate index over node features that dense seeding uses above a node count (``seed.search``).

An inverted-file index with flat (uncompressed) lists and the inner product (faiss ``IndexIVFFlat``):
spherical k-means over a bounded, seeded sample of the node rows gives ``nlist`` unit centroids, every
node is filed under its nearest one, and a query scans the ``nprobe`` lists whose centroids it is
closest to. It was chosen by measurement on a 1M-node graph (benchmarks/bench_seeds.py): a graph index
(HNSW) took longer to build than the exact search of 20K queries and found few of the exact top-3 for
questions, which lie far from every node; the inverted file builds in seconds and its recall rises
steadily with ``nprobe`` up to exact search at ``nprobe = nlist``.

The lists hold the rows themselves, so the candidates' vectors come back from the index and every
candidate is re-scored with the same float32 product as the exact search. A few more than k candidates
are taken (``seed.ann_extra``) and ranked by (score descending, id ascending): whenever the index finds
the exact top-k, ids, order and scores are those of ``dense_seeds``, padding (-1, -inf) included.

The index serialises to bytes (``AnnIndex.to_bytes``) with a small header naming its parameters, so a
worker process or another node searches blocks of queries without the node features
(``search_block``); each process deserialises a given index once.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from seeder.config import ConfigError, SeedConfig
from seeder.retrieve.topk import dense_seeds, merge_topk
from seeder.system.mapped import release, take_rows

INDEX_TYPE = "ivf_flat"
MAGIC = b"SEEDER-ANN-1\n"
KMEANS_ITERATIONS = 10
"""Spherical k-means iterations when training the centroids; beyond 10 the build grows and recall at a
given nprobe barely moves (the centroids only route queries; candidates are re-scored exactly)."""
MIN_POINTS_PER_LIST = 39
"""faiss's own floor for k-means: fewer training rows per centroid leave centroids undetermined, so the
derived ``nlist`` never exceeds ``train rows / 39``."""


@dataclass(frozen=True)
class AnnParams:
    """What an index was built with; carried in its serialised header and in the seeds stage's info."""

    index: str
    nodes: int
    dim: int
    nlist: int
    train_rows: int
    seed: int
    build_id: str


def check_ann_config(cfg: SeedConfig) -> None:
    """Reject ANN settings that cannot build or search an index (a ConfigError naming the key)."""
    bad = [
        f"seed.{name}={getattr(cfg, name)!r}"
        for name in ("ann_min_nodes", "ann_nprobe", "ann_train_sample")
        if getattr(cfg, name) < 1
    ]
    bad += [f"seed.{name}={getattr(cfg, name)!r}" for name in ("ann_nlist", "ann_extra") if getattr(cfg, name) < 0]
    if not cfg.ann_nlist_factor > 0:
        bad.append(f"seed.ann_nlist_factor={cfg.ann_nlist_factor!r}")
    if not 0 <= cfg.ann_min_recall <= 1:
        bad.append(f"seed.ann_min_recall={cfg.ann_min_recall!r}")
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: ann_min_nodes, ann_nprobe and ann_train_sample must be >= 1, ann_nlist and "
            "ann_extra >= 0 (ann_nlist 0 derives it), ann_nlist_factor > 0 and ann_min_recall in [0, 1]"
        )


def derived_nlist(cfg: SeedConfig, num_nodes: int) -> int:
    """``seed.ann_nlist``, or ``ann_nlist_factor * sqrt(N)`` when 0, never more lists than the training
    sample can place (``MIN_POINTS_PER_LIST`` rows each) nor than there are nodes."""
    train_rows = min(num_nodes, cfg.ann_train_sample)
    nlist = cfg.ann_nlist or int(round(cfg.ann_nlist_factor * math.sqrt(num_nodes)))
    if not cfg.ann_nlist:
        nlist = min(nlist, train_rows // MIN_POINTS_PER_LIST)
    return max(1, min(nlist, train_rows))


def _faiss():
    import faiss  # optional: only for an ANN index

    return faiss


class AnnIndex:
    """An inverted-file index over node features; build with ``AnnIndex.build``."""

    def __init__(self, index, params: AnnParams):
        self.index = index
        self.params = params

    @classmethod
    def build(cls, node_features: np.ndarray, cfg: SeedConfig, block_rows: int = 131_072) -> "AnnIndex":
        """Train on a seeded sample of at most ``seed.ann_train_sample`` rows, then add every node in
        blocks of ``block_rows`` (``node_features`` may be a memmap: one block is read at a time)."""
        faiss = _faiss()
        check_ann_config(cfg)
        num_nodes, dim = node_features.shape
        if num_nodes == 0:
            raise ValueError("an ANN index needs at least one node")
        nlist = derived_nlist(cfg, num_nodes)
        train_rows = min(num_nodes, cfg.ann_train_sample)
        # Sorted rows: one forward pass over a memmap instead of random reads.
        rows = np.sort(np.random.default_rng(cfg.ann_seed).choice(num_nodes, size=train_rows, replace=False))
        sample = np.ascontiguousarray(take_rows(node_features, rows), dtype=np.float32)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        # Unit centroids: routing by inner product is then routing by cosine, and no centroid draws
        # queries by its norm alone (plain k-means under the inner product fills a few huge lists).
        index.cp.spherical = True
        index.cp.niter = KMEANS_ITERATIONS
        index.cp.seed = cfg.ann_seed
        index.cp.max_points_per_centroid = max(1, -(-train_rows // nlist))  # the sample is already bounded
        index.train(sample)
        del sample
        for start in range(0, num_nodes, block_rows):
            block = node_features[start : start + block_rows]
            index.add(np.ascontiguousarray(block, dtype=np.float32))
            release(block)  # a memmap's block leaves this process once added (seeder.system.mapped)
        index.make_direct_map()  # candidates' rows are read back for the exact re-scoring
        index.nprobe = min(cfg.ann_nprobe, nlist)
        params = AnnParams(INDEX_TYPE, int(num_nodes), int(dim), int(nlist), int(train_rows), int(cfg.ann_seed), uuid.uuid4().hex)
        return cls(index, params)

    def to_bytes(self) -> bytes:
        """The index as bytes: a header line with its parameters, then faiss's own serialisation."""
        header = json.dumps(asdict(self.params), sort_keys=True).encode() + b"\n"
        return MAGIC + header + _faiss().serialize_index(self.index).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes | np.ndarray) -> "AnnIndex":
        """An index from ``to_bytes`` (bytes, or a uint8 array such as a zero-copy object-store view)."""
        buf, params, end = _header(data)
        return cls(_faiss().deserialize_index(np.ascontiguousarray(buf[end:])), params)

    @property
    def info(self) -> dict:
        """The parameters for run summaries: type, size, lists, training rows, current nprobe."""
        return {**asdict(self.params), "nprobe": int(self.index.nprobe)}

    def search(
        self, query_features: np.ndarray, k: int, nprobe: int | None = None, extra: int = 8, block_queries: int = 4_096
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` nodes per query: (ids int64 [Q, k], scores float32 [Q, k]) in ``dense_seeds``'s format.

        The index proposes ``k + extra`` candidates from ``nprobe`` lists (default: the index's own);
        they are re-scored exactly and ranked by (score descending, id ascending), padding (-1, -inf)
        last. ``block_queries`` bounds the candidate vectors held at once."""
        if k < 1:
            raise ConfigError(f"seed.k0 must be at least 1, got {k}")
        query_features = np.asarray(query_features, dtype=np.float32)
        if query_features.ndim != 2 or (len(query_features) and query_features.shape[1] != self.params.dim):
            raise ValueError(f"query features of shape {query_features.shape} for an index of dimension {self.params.dim}")
        if nprobe is not None:
            self.index.nprobe = max(1, min(int(nprobe), self.params.nlist))
        width = min(k + max(extra, 0), self.params.nodes)
        out_ids = np.full((len(query_features), k), -1, dtype=np.int64)
        out_scores = np.full((len(query_features), k), -np.inf, dtype=np.float32)
        for start in range(0, len(query_features), block_queries):
            queries = np.ascontiguousarray(query_features[start : start + block_queries])
            _, cand = self.index.search(queries, width)
            pad = ((0, 0), (0, max(k - width, 0)))  # fewer nodes than k: padded as dense_seeds pads
            ids = np.pad(cand.astype(np.int64, copy=False), pad, constant_values=-1)
            scores = np.pad(self._rescore(queries, cand), pad, constant_values=-np.inf)
            out_ids[start : start + len(queries)], out_scores[start : start + len(queries)] = merge_topk(ids, scores, k)
        return out_ids, out_scores

    def _rescore(self, queries: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Exact float32 scores of the candidates (-inf where the index found none). One product of the
        block's queries with its distinct candidates' rows, as the exact search multiplies a block of
        queries with a block of nodes, rather than a dot product per pair."""
        found = cand >= 0
        unique, where = np.unique(cand[found], return_inverse=True)
        out = np.full(cand.shape, -np.inf, dtype=np.float32)
        if len(unique):
            vectors = self.index.reconstruct_batch(unique)
            products = queries @ vectors.T
            rows = np.nonzero(found)[0]
            out[found] = products[rows, where]
        return out


def search_block(
    index: "AnnIndex | bytes | np.ndarray", query_features: np.ndarray, cfg: SeedConfig
) -> tuple[np.ndarray, np.ndarray]:
    """The dense seeds of one block of queries from an index or its serialised bytes, with
    ``cfg``'s k0, nprobe and extra candidates: what a task of a distributed seeding run calls. A
    serialised index is deserialised once per process (by its build id) and reused by later blocks."""
    if not isinstance(index, AnnIndex):
        index = _loaded(index)
    return index.search(query_features, cfg.k0, nprobe=cfg.ann_nprobe, extra=cfg.ann_extra)


_CACHE: dict[str, AnnIndex] = {}


def _header(data: bytes | np.ndarray) -> tuple[np.ndarray, AnnParams, int]:
    """(the data as uint8, without a copy; the parameters of its header; where faiss's bytes start)."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    newline = np.flatnonzero(buf[len(MAGIC) : len(MAGIC) + 4096] == ord("\n"))
    if bytes(buf[: len(MAGIC)]) != MAGIC or not len(newline):
        raise ValueError("not a serialised seed ANN index (see AnnIndex.to_bytes)")
    end = len(MAGIC) + int(newline[0]) + 1
    return buf, AnnParams(**json.loads(bytes(buf[len(MAGIC) : end]))), end


def _loaded(data: bytes | np.ndarray) -> AnnIndex:
    """Deserialise ``data`` unless this process already holds the index with the same build id."""
    buf, params, _ = _header(data)
    if params.build_id in _CACHE:
        return _CACHE[params.build_id]
    index = AnnIndex.from_bytes(buf)
    _CACHE.clear()  # one index per process: a new one replaces the old (each can be gigabytes)
    _CACHE[index.params.build_id] = index
    return index


def sample_recall(
    query_features: np.ndarray, node_features: np.ndarray, index: AnnIndex, cfg: SeedConfig, sample: int = 1_000, seed: int = 0
) -> dict:
    """Top-k0 recall of the index against exact search on a seeded sample of the queries (exact over
    every node for that sample only, about sample / Q of the exact stage): the share of the exact
    top-k0 ids (padding excluded) that the index's rows hold, and the share of identical rows."""
    num = len(query_features)
    rows = np.sort(np.random.default_rng(seed).choice(num, size=min(sample, num), replace=False))
    queries = np.asarray(query_features[rows], dtype=np.float32)
    exact_ids, _ = dense_seeds(queries, node_features, cfg.k0, cfg.block_nodes, cfg.block_queries)
    ann_ids, _ = search_block(index, queries, cfg)
    identical = float(np.mean((ann_ids == exact_ids).all(axis=1))) if len(rows) else 1.0
    return {"recall": topk_recall(ann_ids, exact_ids), "identical_rows": identical, "sample_queries": int(len(rows))}


def topk_recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact top-k ids (id >= 0) that ``found`` holds in the same row, over all rows."""
    valid = exact >= 0
    if not valid.any():
        return 1.0
    hit = (exact[:, :, None] == found[:, None, :]).any(axis=2) & valid
    return float(hit.sum() / valid.sum())
