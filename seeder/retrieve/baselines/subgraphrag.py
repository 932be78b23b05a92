"""SubgraphRAG-style triple scoring (Li et al. 2025; paper, Appendix E), without a trained scorer.

Dense seeds, a bounded 2-hop subgraph, every triple scored by a weighted sum of head, relation
and tail cosines; the retrieved set is the seeds plus the endpoints of the top triples, each node
ranked by its best top triple (seeds that no top triple reaches keep their own cosine).
"""

from __future__ import annotations

import numpy as np

from seeder.config import BaselinesConfig, ConfigError
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import (
    BaselineInputs,
    dense_seeds,
    ego_graphs,
    full_ranking,
    group_topk,
    in_batches,
    pair_cosine,
    rank_candidates,
)


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    if len(cfg.subgraphrag.weights) != 3:
        raise ConfigError(
            f"baselines.subgraphrag.weights must hold 3 weights (head, relation, tail), got {cfg.subgraphrag.weights}"
        )
    w_head, w_rel, w_tail = cfg.subgraphrag.weights

    def run(batch: BaselineInputs) -> RetrievalResult:
        seeds, _ = dense_seeds(batch, cfg.seeds)
        ego = ego_graphs(batch, seeds, cfg.ego.hops, cfg.ego.neighbor_cap, cfg.ego.max_nodes)
        relation_sim = pair_cosine(batch.query_features, ego.edge_query, batch.relation_features, ego.edge_relation)
        score = w_head * ego.sim[ego.edge_head] + w_rel * relation_sim + w_tail * ego.sim[ego.edge_tail]
        edge_ids = np.arange(len(score))
        top = group_topk(ego.edge_query, score, edge_ids, cfg.subgraphrag.top_triples)
        is_seed = ego.hop == 0
        flat = np.concatenate([ego.edge_head[top], ego.edge_tail[top], np.flatnonzero(is_seed)])
        node_score = np.concatenate([score[top], score[top], ego.sim[is_seed]])
        ranking, counts = rank_candidates(ego.num_queries, ego.query[flat], ego.node[flat], node_score)
        return full_ranking(batch, ranking, counts, length)

    return in_batches(inputs, cfg.block_queries, run, length)
