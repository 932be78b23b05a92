"""The dense reference retriever: every node ranked by cosine to the query.

The ranking is the exact top-L by cosine (the blocked kernel of ``dense_seeds``); the retrieved set
is its first ``expand.budget`` nodes, the same size as a K-HOP-WITH-FILTERING subgraph, so Hit@any
and Recall@any compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seeder.config import SeederConfig
from seeder.data.subgraphs import SubgraphSet
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.registry import register
from seeder.retrieve.seeds import dense_seeds


def ranking_length(config: SeederConfig) -> int:
    """L: every full ranking has this many entries (enough for metrics and for the retrieved set)."""
    return max(config.eval.ranking_length, config.expand.budget)


def dense_ranking(query_features: np.ndarray, node_features: np.ndarray, length: int, config: SeederConfig) -> np.ndarray:
    """Top-``length`` node ids by cosine, best first, ties by id; [Q, length] padded -1."""
    ids, _ = dense_seeds(
        query_features, node_features, length, block_nodes=config.seed.block_nodes, block_queries=config.seed.block_queries
    )
    return ids


@dataclass
class DenseRetriever:
    node_features: np.ndarray
    config: SeederConfig

    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult:
        ranking = dense_ranking(query_features, self.node_features, ranking_length(self.config), self.config)
        set_size = np.minimum((ranking >= 0).sum(axis=1), self.config.expand.budget)
        return RetrievalResult(query_ids=subgraphs.query_ids.copy(), ranking=ranking, set_size=set_size.astype(np.int64))


@register("dense")
def build_dense(artifacts, config: SeederConfig, model: str | None = None) -> DenseRetriever:
    return DenseRetriever(node_features=artifacts.node_features, config=config)
