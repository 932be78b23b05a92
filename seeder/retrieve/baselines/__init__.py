"""The paper's comparison suite (Table 1, Appendix E) plus BM25 and hybrid retrieval.

Each method is ``retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) ->
RetrievalResult``: a full, deterministic ranking of ``length`` node ids per query (the method's own
candidates best first, then the other nodes by dense cosine, ties by node id, no repeats) and the
size of the method's own retrieved set.
"""

from __future__ import annotations

from typing import Callable

from seeder.config import BaselinesConfig, ConfigError
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines import astar, beam, bm25, gretriever, ppr, ppr_mmr, subgraphrag
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph

Retriever = Callable[[BaselineInputs, BaselinesConfig, int], RetrievalResult]

METHODS: dict[str, Retriever] = {
    "g-retriever": gretriever.retrieve,
    "subgraphrag": subgraphrag.retrieve,
    "beam": beam.retrieve,
    "astar": astar.retrieve,
    "ppr": ppr.retrieve,
    "ppr-mmr": ppr_mmr.retrieve,
    "bm25": bm25.retrieve_bm25,
    "hybrid": bm25.retrieve_hybrid,
}
"""Baseline name -> retriever. ``bm25`` and ``hybrid`` need query and node texts in the inputs."""

NEEDS_TEXT = frozenset({"bm25", "hybrid"})


def run_baseline(name: str, inputs: BaselineInputs, cfg: BaselinesConfig | None = None, length: int = 100) -> RetrievalResult:
    """Run baseline ``name`` on ``inputs``; an unknown name is an error listing the known ones."""
    if name not in METHODS:
        raise ConfigError(f"unknown baseline {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name](inputs, cfg or BaselinesConfig(), length)


__all__ = [
    "METHODS",
    "NEEDS_TEXT",
    "BaselineInputs",
    "InMemoryGraph",
    "run_baseline",
]
