"""Beam traversal (paper, Appendix E): the top dense seeds, a fixed number of hops, a fixed beam width.

A transition u -r-> v scores w_dst * cos(q, v) + w_rel * cos(q, r) + w_prev * score(path to u)
minus a hop penalty. After each hop every query keeps its ``beam.width`` best new nodes (a node
reached twice keeps its best path; nodes reached at an earlier hop are not re-entered). Reached
nodes are ranked by their best path score. The beams of all queries advance together.
"""

from __future__ import annotations

import numpy as np

from seeder.config import BaselinesConfig, ConfigError
from seeder.data.subgraphs import sorted_lookup
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import (
    BaselineInputs,
    csr_expand,
    dedupe_max,
    dense_seeds,
    full_ranking,
    group_topk,
    in_batches,
    pair_cosine,
    rank_candidates,
)


def transition_weights(cfg: BaselinesConfig) -> tuple[float, float, float]:
    if len(cfg.beam.weights) != 3:
        raise ConfigError(
            f"baselines.beam.weights must hold 3 weights (destination, relation, previous score), got {cfg.beam.weights}"
        )
    return tuple(float(w) for w in cfg.beam.weights)  # type: ignore[return-value]


def beam_search(
    inputs: BaselineInputs, seeds: np.ndarray, seed_scores: np.ndarray, cfg: BaselinesConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reached (query position, node, best path score) of a batch; seeds [Q,k] -1 padded start at their cosine."""
    w_dst, w_rel, w_prev = transition_weights(cfg)
    n = int(inputs.graph.num_nodes)
    valid = seeds >= 0
    state_q, state_n, state_s = dedupe_max(
        np.repeat(np.arange(len(seeds)), valid.sum(1)), seeds[valid].astype(np.int64), seed_scores[valid].astype(np.float64)
    )
    reached = [(state_q, state_n, state_s)]
    visited = np.sort(state_q * n + state_n)
    for _ in range(cfg.beam.hops):
        if not len(state_n):
            break
        owner, nbr, rel = csr_expand(inputs.graph, state_n, cfg.ego.neighbor_cap)
        q = state_q[owner]
        score = (
            w_dst * pair_cosine(inputs.query_features, q, inputs.node_features, nbr)
            + w_rel * pair_cosine(inputs.query_features, q, inputs.relation_features, rel)
            + w_prev * state_s[owner]
            - cfg.beam.hop_penalty
        )
        key = q * n + nbr
        fresh = ~sorted_lookup(visited, key)[0]
        q, nbr, score = dedupe_max(q[fresh], nbr[fresh], score[fresh])
        keep = group_topk(q, score, nbr, cfg.beam.width)
        state_q, state_n, state_s = q[keep], nbr[keep], score[keep]
        reached.append((state_q, state_n, state_s))
        visited = np.sort(np.concatenate([visited, state_q * n + state_n]))
    return tuple(np.concatenate(parts) for parts in zip(*reached))  # type: ignore[return-value]


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """Every node a beam reached, best path score first; the retrieved set is all of them."""

    def run(batch: BaselineInputs) -> RetrievalResult:
        seeds, seed_scores = dense_seeds(batch, cfg.seeds)
        q, node, score = beam_search(batch, seeds, seed_scores, cfg)
        ranking, counts = rank_candidates(len(seeds), q, node, score)
        return full_ranking(batch, ranking, counts, length)

    return in_batches(inputs, cfg.block_queries, run, length)
