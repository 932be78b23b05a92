"""A trained SeedER model as a LlamaIndex retriever (``pip install 'seeder[llamaindex]'``).

    from seeder.integrations.llamaindex import SeedERRetriever
    retriever = SeedERRetriever.load("runs/metaqa/model/model", k=10)
    nodes = retriever.retrieve("what languages are the films directed by Joel Zwick in")

One ``NodeWithScore`` per retrieved node, best first: a ``TextNode`` whose id is the graph node's id,
whose text is its name and text, and whose metadata is that of ``seeder.integrations.node_records``, with
the model's score. A query engine's LLM reads the name, the type and the triples from the metadata; the
rank, id, score, step, dataset version and provenance stay out of what the LLM and an embedding model read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seeder.integrations import ask, missing_extra, node_records
from seeder.serving.retriever import Retriever

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # an optional dependency: the extra names it
    raise missing_extra(__name__, "llamaindex", "llama-index-core", exc) from exc

HIDDEN_METADATA = ["rank", "id", "score", "step", "dataset", "provenance"]
"""Metadata kept out of the text an LLM or an embedding model reads of a node: bookkeeping, not facts."""


class SeedERRetriever(BaseRetriever):
    """A ``seeder.serving.retriever.Retriever`` behind LlamaIndex's retriever interface. ``types`` and
    ``where`` filter the nodes shown, as in ``Retriever.retrieve``; the expansion is unchanged."""

    def __init__(
        self,
        retriever: Retriever,
        k: int = 10,
        types: list[str] | None = None,
        where: dict[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ):
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.retriever, self.k, self.types, self.where = retriever, k, types, where

    @classmethod
    def load(
        cls,
        model: str | Path,
        artifacts: str | Path | None = None,
        k: int = 10,
        types: list[str] | None = None,
        where: dict[str, Any] | None = None,
        **options: Any,
    ) -> "SeedERRetriever":
        """``Retriever.load(model, artifacts, **options)`` (``device``, ``encoder_precision``, ``compiled``,
        ``accept_mismatch``) behind this interface."""
        return cls(Retriever.load(model, artifacts=artifacts, **options), k=k, types=types, where=where)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = ask(self.retriever, query_bundle.query_str, self.k, self.types, self.where)
        return [
            NodeWithScore(
                node=TextNode(
                    text=text,
                    id_=str(metadata["id"]),
                    metadata=metadata,
                    excluded_llm_metadata_keys=HIDDEN_METADATA,
                    excluded_embed_metadata_keys=HIDDEN_METADATA,
                ),
                score=metadata["score"],
            )
            for text, metadata in node_records(self.retriever, hits)
        ]
