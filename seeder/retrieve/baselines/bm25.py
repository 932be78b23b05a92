"""The BM25 and hybrid (BM25 + dense, reciprocal rank fusion) retrievers over node text.

The index and the fusion are ``seeder.retrieve.lexical``'s, which seeding uses too; here the index of
a dataset is built once per ``BaselineInputs`` (its ``cache``).
"""

from __future__ import annotations

from seeder.config import BaselinesConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import BaselineInputs, full_ranking
from seeder.retrieve.lexical import BM25Index, hybrid_ranking
from seeder.system.io import DataError


def _inputs_index(inputs: BaselineInputs, cfg: BaselinesConfig) -> BM25Index:
    texts = inputs.node_texts
    if texts is None and hasattr(inputs.graph, "nodes"):
        texts = inputs.graph.nodes.column("text").to_pylist()
    if texts is None:
        raise DataError("BM25 needs node texts: pass node_texts, or a dataset graph that has a nodes table")
    key = ("bm25", cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
    if key not in inputs.cache:
        inputs.cache[key] = BM25Index.build(texts, cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
    return inputs.cache[key]


def _query_texts(inputs: BaselineInputs) -> list[str]:
    if inputs.query_texts is None:
        raise DataError("BM25 and hybrid retrieval need query texts: build the inputs with with_texts=True")
    return inputs.query_texts


def retrieve_bm25(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """Nodes by BM25 score; the retrieved set is those with a positive score (to ``length``)."""
    texts = _query_texts(inputs)
    ids, _ = _inputs_index(inputs, cfg).topk(texts, length)
    return full_ranking(inputs, ids, (ids >= 0).sum(1), length)


def retrieve_hybrid(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """Nodes by fused rank; the retrieved set is the union of both pools (to ``length``)."""
    texts = _query_texts(inputs)
    inputs.dense_depth = max(inputs.dense_depth, length, cfg.hybrid.pool)
    ids, _ = hybrid_ranking(
        _inputs_index(inputs, cfg), texts, inputs.dense_ranking(cfg.hybrid.pool)[0], cfg.hybrid.pool, cfg.hybrid.rrf_k
    )
    return full_ranking(inputs, ids, (ids >= 0).sum(1), length)
