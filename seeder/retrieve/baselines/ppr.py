"""Personalized PageRank on the bounded 2-hop ego graph (paper, Appendix E).

Restart on the top dense seeds weighted by their cosine, restart probability 0.15, a fixed number of
power iterations; the final relevance mixes max-normalised PPR with dense cosine. All queries of a
batch iterate together: their ego graphs form one disjoint union and one step is one ``bincount``.
"""

from __future__ import annotations

import numpy as np

from seeder.config import BaselinesConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import (
    BaselineInputs,
    EgoGraphs,
    dense_seeds,
    ego_graphs,
    full_ranking,
    in_batches,
    rank_candidates,
)


def restart_weights(ego: EgoGraphs, seeds: np.ndarray, seed_scores: np.ndarray) -> np.ndarray:
    """Restart distribution over flat ego nodes: each query's seeds weighted by max(cosine, eps), sum 1."""
    n = int(ego.node.max(initial=0)) + 1
    valid = seeds >= 0
    query = np.repeat(np.arange(len(seeds)), valid.sum(1))
    key = query * n + seeds[valid]
    flat = np.searchsorted(ego.query * n + ego.node, key)
    restart = np.zeros(len(ego.node), dtype=np.float64)
    np.add.at(restart, flat, np.maximum(seed_scores[valid].astype(np.float64), 1e-6))
    total = np.bincount(ego.query, weights=restart, minlength=ego.num_queries)
    return restart / np.where(total > 0, total, 1.0)[ego.query]


def personalized_pagerank(
    num_nodes: int,
    group: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    restart: np.ndarray,
    restart_prob: float,
    iterations: int,
) -> np.ndarray:
    """Power iteration of PPR on a disjoint union of graphs (``group`` [num_nodes] names each node's graph).

    ``src -> dst`` are directed transitions (pass both directions for an undirected graph), each of
    weight 1 / out-degree. A node without out-transitions gives its mass back to its graph's restart
    distribution (networkx's convention), so every graph's vector keeps summing to 1.
    """
    out_degree = np.bincount(src, minlength=num_nodes).astype(np.float64)
    dangling = out_degree == 0
    inv_degree = np.where(dangling, 0.0, 1.0 / np.maximum(out_degree, 1.0))
    num_groups = int(group.max(initial=-1)) + 1
    x = restart.copy()
    for _ in range(iterations):
        spread = np.bincount(dst, weights=(x * inv_degree)[src], minlength=num_nodes)
        lost = np.bincount(group[dangling], weights=x[dangling], minlength=num_groups)
        x = (1.0 - restart_prob) * (spread + lost[group] * restart) + restart_prob * restart
    return x


def ppr_relevance(inputs: BaselineInputs, cfg: BaselinesConfig) -> tuple[EgoGraphs, np.ndarray]:
    """The ego graphs of a batch and each flat node's relevance: w * PPR / max PPR + (1 - w) * cosine."""
    seeds, seed_scores = dense_seeds(inputs, cfg.seeds)
    ego = ego_graphs(inputs, seeds, cfg.ego.hops, cfg.ego.neighbor_cap, cfg.ego.max_nodes)
    restart = restart_weights(ego, seeds, seed_scores)
    # The ego graph is walked undirected: a relation's direction says nothing about relevance.
    src = np.concatenate([ego.edge_head, ego.edge_tail])
    dst = np.concatenate([ego.edge_tail, ego.edge_head])
    ppr = personalized_pagerank(len(ego.node), ego.query, src, dst, restart, cfg.ppr.restart, cfg.ppr.iterations)
    peak = np.zeros(ego.num_queries)
    np.maximum.at(peak, ego.query, ppr)
    normalised = ppr / np.where(peak > 0, peak, 1.0)[ego.query]
    return ego, cfg.ppr.weight * normalised + (1.0 - cfg.ppr.weight) * ego.sim


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """Ego-graph nodes ranked by PPR relevance; the retrieved set is the whole ego graph (to ``length``)."""

    def run(batch: BaselineInputs) -> RetrievalResult:
        ego, relevance = ppr_relevance(batch, cfg)
        ranking, counts = rank_candidates(ego.num_queries, ego.query, ego.node, relevance)
        return full_ranking(batch, ranking, counts, length)

    return in_batches(inputs, cfg.block_queries, run, length)
