"""The baselines as methods of ``seeder evaluate --method NAME`` (see ``seeder.retrieve.registry``).

The registry's retrievers receive the preprocessed subgraph set only for its query ids: every
baseline builds its own candidates from the graph, as in the paper's Appendix E.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seeder.config import SeederConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines import METHODS, NEEDS_TEXT
from seeder.retrieve.baselines.common import BaselineInputs
from seeder.retrieve.dense import ranking_length
from seeder.retrieve.registry import register


@dataclass
class BaselineRetriever:
    name: str
    artifacts: Any
    config: SeederConfig
    cache: dict = field(default_factory=dict)

    def _query_texts(self, query_ids: np.ndarray) -> list[str]:
        dataset = self.artifacts.dataset
        texts = dataset.queries.column("text").to_pylist()
        return [texts[i] for i in dataset.query_rows(query_ids)]

    def retrieve(self, subgraphs, query_features: np.ndarray) -> RetrievalResult:
        query_ids = np.asarray(subgraphs.query_ids, dtype=np.int64)
        kg = self.artifacts.dataset
        text = self.name in NEEDS_TEXT
        inputs = BaselineInputs(
            kg,
            self.artifacts.node_features,
            self.artifacts.relation_features,
            query_ids,
            np.asarray(query_features, dtype=np.float32),
            self._query_texts(query_ids) if text else None,
            None,  # BM25 reads node texts from the dataset once and caches its index
            self.cache,
        )
        return METHODS[self.name](inputs, self.config.baselines, ranking_length(self.config))


def _builder(name: str):
    def build(artifacts, config: SeederConfig, model: str | None = None) -> BaselineRetriever:
        return BaselineRetriever(name, artifacts, config)

    build.__name__ = f"build_{name.replace('-', '_')}"
    return build


for _name in ("g-retriever", "subgraphrag", "beam", "astar", "ppr", "ppr-mmr", "bm25", "hybrid"):
    register(_name)(_builder(_name))
