"""A trained SeedER model as a LangChain retriever (``pip install 'seeder[langchain]'``).

    from seeder.integrations.langchain import SeedERRetriever
    retriever = SeedERRetriever.load("runs/metaqa/model/model", k=10)
    docs = retriever.invoke("what languages are the films directed by Joel Zwick in")

One ``Document`` per retrieved node, best first: the node's name and text as ``page_content``, its rank,
id, name, type, score, step, the dataset version and the triples among the retrieved nodes that involve
it as ``metadata`` (``seeder.integrations.node_records``). It is a ``BaseRetriever``, so it composes
with chains and with ``langchain_core.tools.create_retriever_tool`` for agents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seeder.integrations import ask, missing_extra, node_records
from seeder.serving.retriever import Retriever

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # an optional dependency: the extra names it
    raise missing_extra(__name__, "langchain", "langchain-core", exc) from exc


class SeedERRetriever(BaseRetriever):
    """A ``seeder.serving.retriever.Retriever`` behind LangChain's retriever interface. ``types`` and
    ``where`` filter the nodes shown, as in ``Retriever.retrieve``; the expansion is unchanged."""

    retriever: Retriever
    """The loaded model and its artifacts (``Retriever.load``); several adapters may share one."""
    k: int = 10
    """Nodes per question."""
    types: list[str] | None = None
    """Show only nodes of these types."""
    where: dict[str, Any] | None = None
    """Show only nodes whose node-table columns hold these values (``{"column": value or [values]}``)."""

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
        return cls(retriever=Retriever.load(model, artifacts=artifacts, **options), k=k, types=types, where=where)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        hits = ask(self.retriever, query, self.k, self.types, self.where)
        return [Document(page_content=text, metadata=metadata) for text, metadata in node_records(self.retriever, hits)]
