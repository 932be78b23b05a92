"""Lexical seeding: BM25 over node text (bm25s) and hybrid BM25 + dense by reciprocal rank fusion.

Seeding strategies ``seed.strategy: bm25`` and ``hybrid`` (``seeder.retrieve.seeds``) and the BM25 and
hybrid baselines (``seeder.retrieve.baselines.bm25``) share this index and fusion. The seeding index of a
dataset is built once per process and kept (one dataset at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

from seeder.config import BaselinesConfig
from seeder.retrieve.base import group_rank

_SEED_INDEXES: dict[tuple, "BM25Index"] = {}


@dataclass
class BM25Index:
    """A bm25s index of node texts plus the tokenizer whose vocabulary it was built with."""

    tokenizer: Tokenizer
    model: bm25s.BM25
    num_docs: int

    @classmethod
    def build(cls, texts: list[str], k1: float = 1.5, b: float = 0.75, stopwords: str = "en") -> "BM25Index":
        tokenizer = Tokenizer(stopwords=stopwords or None)
        ids = tokenizer.tokenize(list(texts), return_as="ids", show_progress=False)
        model = bm25s.BM25(k1=k1, b=b)
        model.index(ids, show_progress=False)
        return cls(tokenizer, model, len(texts))

    def topk(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k documents with a positive score per query, best first, ties by id; -1 / 0 padded."""
        k = min(k, self.num_docs)
        tokens = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        docs = np.asarray(docs, dtype=np.int64).reshape(len(queries), k)
        scores = np.asarray(scores, dtype=np.float32).reshape(len(queries), k)
        docs = np.where(scores > 0, docs, -1)
        scores = np.where(scores > 0, scores, 0.0).astype(np.float32)
        order = np.lexsort((np.where(docs >= 0, docs, np.iinfo(np.int64).max), -scores), axis=1)
        return np.take_along_axis(docs, order, axis=1), np.take_along_axis(scores, order, axis=1)


def reciprocal_rank_fusion(rankings: list[np.ndarray], rrf_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fuse [Q, L_i] rankings (-1 padded): score(v) = sum_i 1 / (rrf_k + rank_i(v)), ranks from 1.

    Returns (ids [Q, W], fused scores [Q, W]) best first, ties by node id, -1 / 0 padded.
    """
    num_q = len(rankings[0])
    query = np.concatenate([np.repeat(np.arange(num_q), r.shape[1]) for r in rankings])
    node = np.concatenate([r.ravel() for r in rankings])
    contribution = np.concatenate(
        [np.broadcast_to(1.0 / (rrf_k + np.arange(1, r.shape[1] + 1)), r.shape).ravel() for r in rankings]
    )
    keep = node >= 0
    query, node, contribution = query[keep], node[keep], contribution[keep]
    keys, inverse = np.unique(np.stack([query, node], axis=1), axis=0, return_inverse=True)
    fused = np.bincount(inverse.ravel(), weights=contribution, minlength=len(keys))
    order, rank = group_rank(keys[:, 0], fused, keys[:, 1])
    width = int(rank.max(initial=-1)) + 1
    ids = np.full((num_q, width), -1, dtype=np.int64)
    scores = np.zeros((num_q, width))
    ids[keys[order, 0], rank] = keys[order, 1]
    scores[keys[order, 0], rank] = fused[order]
    return ids, scores


def hybrid_ranking(index: BM25Index, texts: list[str], dense: np.ndarray, pool: int, rrf_k: int) -> tuple[np.ndarray, np.ndarray]:
    """RRF of the BM25 top ``pool`` and the dense ranking ``dense`` [Q, >= pool]: (ids [Q, W], fused scores)."""
    lexical, _ = index.topk(texts, pool)
    dense = dense[:, :pool]
    return reciprocal_rank_fusion([lexical, dense], rrf_k)


def _seed_index(kg: Any, cfg: BaselinesConfig) -> BM25Index:
    key = (str(getattr(kg, "path", id(kg))), getattr(kg, "fingerprint", None), cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
    if key not in _SEED_INDEXES:
        _SEED_INDEXES.clear()  # one dataset at a time: an index of millions of texts is large
        _SEED_INDEXES[key] = BM25Index.build(kg.nodes.column("text").to_pylist(), cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
    return _SEED_INDEXES[key]


def bm25_seeds(kg: Any, texts: list[str], k0: int, cfg: BaselinesConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k0 nodes of ``kg`` by BM25 of node text against each query text: (ids [Q,k0], scores [Q,k0]).

    Padded like ``seeder.retrieve.seeds.dense_seeds``: id -1 with score -inf.

    A query sharing no term with any node gets no seeds (-1); combine with dense seeding for those.
    """
    cfg = cfg or BaselinesConfig()
    ids, scores = _seed_index(kg, cfg).topk(texts, k0)
    return ids, np.where(ids >= 0, scores, -np.inf).astype(np.float32)


def hybrid_seeds(
    kg: Any,
    texts: list[str],
    dense: np.ndarray,
    k0: int,
    cfg: BaselinesConfig | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k0 nodes by reciprocal rank fusion of BM25 and the dense ranking ``dense`` [Q, >= pool]
    (``cfg.hybrid.pool``, rows following ``texts``): (ids [Q,k0], fused scores), padded -1 / -inf.
    """
    cfg = cfg or BaselinesConfig()
    ids, scores = hybrid_ranking(_seed_index(kg, cfg), texts, dense, cfg.hybrid.pool, cfg.hybrid.rrf_k)
    ids, scores = ids[:, :k0], scores[:, :k0]
    if ids.shape[1] < k0:
        pad = k0 - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)))
    return ids, np.where(ids >= 0, scores, -np.inf).astype(np.float32)
