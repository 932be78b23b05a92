"""PPR + maximal marginal relevance (paper, Appendix E).

A pool of the top ``mmr_pool`` nodes by PPR relevance, then ``mmr_select`` chosen greedily by
MMR: lambda * relevance - (1 - lambda) * max cosine to the already chosen nodes. The greedy steps
are sequential by nature, but each step runs for every query of the batch at once.
"""

from __future__ import annotations

import numpy as np

from seeder.config import BaselinesConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import BaselineInputs, full_ranking, in_batches, rank_candidates
from seeder.retrieve.baselines.ppr import ppr_relevance


def mmr_select(relevance: np.ndarray, embeddings: np.ndarray, valid: np.ndarray, select: int, lam: float) -> np.ndarray:
    """Greedy MMR for a batch of pools: relevance [Q, P], embeddings [Q, P, d], valid [Q, P].

    Returns [Q, select] pool positions in the order chosen (-1 once a pool is exhausted). Ties go
    to the lower pool position, so pools sorted best first make the choice deterministic.
    """
    num_q, pool = relevance.shape
    similarity = np.einsum("qid,qjd->qij", embeddings, embeddings)
    redundancy = np.full((num_q, pool), -np.inf)
    available = valid.copy()
    chosen = np.full((num_q, select), -1, dtype=np.int64)
    rows = np.arange(num_q)
    for step in range(min(select, pool)):
        # Before anything is chosen there is no redundancy term: MMR starts from the most relevant node.
        penalty = np.where(np.isfinite(redundancy), redundancy, 0.0)
        score = np.where(available, lam * relevance - (1.0 - lam) * penalty, -np.inf)
        best = np.argmax(score, axis=1)
        ok = available[rows, best]
        chosen[ok, step] = best[ok]
        available[rows[ok], best[ok]] = False
        redundancy[ok] = np.maximum(redundancy[ok], similarity[rows[ok], best[ok]])
    return chosen


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """The MMR-chosen nodes first (the retrieved set), then the rest of the pool by PPR relevance."""

    def run(batch: BaselineInputs) -> RetrievalResult:
        ego, relevance = ppr_relevance(batch, cfg)
        ranked, _ = rank_candidates(ego.num_queries, ego.query, ego.node, relevance)
        pool = ranked[:, : cfg.mmr.pool]
        valid = pool >= 0
        # Relevance of each pooled node, looked up from the flat ego arrays (sorted by (query, node)).
        n = int(batch.graph.num_nodes)
        keys = ego.query * n + ego.node
        pool_keys = np.arange(len(pool))[:, None] * n + np.where(valid, pool, 0)
        flat = np.minimum(np.searchsorted(keys, pool_keys), len(keys) - 1) if len(keys) else np.zeros_like(pool)
        pool_relevance = np.where(valid, relevance[flat] if len(keys) else 0.0, -np.inf)
        embeddings = np.asarray(batch.node_features[np.where(valid, pool, 0).ravel()], dtype=np.float32)
        embeddings = embeddings.reshape(pool.shape + (-1,)) * valid[..., None]
        picks = mmr_select(pool_relevance, embeddings, valid, cfg.mmr.select, cfg.mmr.relevance)
        chosen = np.where(picks >= 0, np.take_along_axis(pool, np.maximum(picks, 0), axis=1), -1)
        set_size = (chosen >= 0).sum(1)
        # The pool's remaining nodes follow in PPR order; full_ranking drops the repeats.
        return full_ranking(batch, np.concatenate([chosen, pool], axis=1), set_size, length)

    return in_batches(inputs, max(1, min(cfg.block_queries, 64)), run, length)
