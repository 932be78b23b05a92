"""Method ``seeder`` of ``seeder evaluate`` / ``seeder benchmark``: a trained model ranking the
artifacts' bounded subgraphs through ``seeder.serving.retriever.Retriever`` (the one inference path)."""

from __future__ import annotations

from seeder.config import SeederConfig
from seeder.retrieve import registry
from seeder.serving.retriever import Retriever
from seeder.system.io import DataError


class SubgraphRanker:
    """The registry's interface (``retrieve(subgraphs, query_features)``) over a ``Retriever``."""

    def __init__(self, retriever):
        self.retriever = retriever

    def retrieve(self, subgraphs, query_features):
        return self.retriever.rank(subgraphs, query_features, progress="seeder")[0]


@registry.register("seeder")
def build_seeder(artifacts, config: SeederConfig, model: str | None = None) -> SubgraphRanker:
    """A trained model on ``artifacts``, retrieving with ``config``'s eval schedule."""
    if not model:
        raise DataError("method 'seeder' needs a trained model: pass --model RUN/model, runs:/ID/model or models:/NAME@ALIAS")
    return SubgraphRanker(
        Retriever.load(
            model, artifacts=artifacts.path, config=config, accept_mismatch=getattr(artifacts, "accept_mismatch", False)
        )
    )
