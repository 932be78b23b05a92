"""A trained retriever inside other frameworks, each an optional extra of the package:

- ``seeder.integrations.langchain``: a LangChain retriever (``pip install 'seeder[langchain]'``);
- ``seeder.integrations.llamaindex``: a LlamaIndex retriever (``pip install 'seeder[llamaindex]'``);
- ``seeder.integrations.mcp``: an MCP server with a ``retrieve`` tool, ``seeder mcp`` (``pip install 'seeder[mcp]'``).

Each module imports its framework at the top, and nothing else of ``seeder`` imports those modules
(``seeder mcp`` imports its module inside the command), so the library and the ``seeder`` command load
without any of them. This package holds what they share and imports none of them: every adapter answers
through ``seeder.serving.retriever.Retriever``, the one inference path, and turns each retrieved node
into the same text and metadata (``node_records``).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pyarrow as pa

from seeder.serving.retriever import Hits, Retriever

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def missing_extra(module: str, extra: str, requirement: str, exc: ImportError) -> ImportError:
    """The error of an adapter whose framework cannot be imported: one line naming the extra to install."""
    return ImportError(f"{module} needs {requirement} ({exc}): pip install 'seeder[{extra}]'")


def lock_of(retriever: Retriever) -> threading.Lock:
    """One lock per ``Retriever``, held by every adapter around a call. Frameworks call retrievers from
    thread pools (LangChain's ``batch`` and ``ainvoke``, the MCP server's worker threads), and a
    ``Retriever`` builds its indexes on first use and keeps its recent filters in a dict, which concurrent
    calls would race on; a call already spreads its own work over the torch threads."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(retriever)
        if lock is None:
            lock = _LOCKS[retriever] = threading.Lock()
        return lock


def ask(retriever: Retriever, question: str, k: int, types: list[str] | None = None, where: dict[str, Any] | None = None) -> Hits:
    """One question's ``Hits``, under the retriever's lock (``lock_of``)."""
    with lock_of(retriever):
        return retriever.retrieve([question], k=k, types=types, where=where)[0]


def node_text(name: str, text: str | None) -> str:
    """What a framework reads of a node: its name, then its text from the dataset's node table, unless the
    text is empty or already starts with the name (an importer gives a node without text its name)."""
    text = (text or "").strip()
    if not text or text == name:
        return name
    return text if text.startswith(name) else f"{name}\n{text}"


def node_records(retriever: Retriever, hits: Hits) -> list[tuple[str, dict[str, Any]]]:
    """(text, metadata) of each retrieved node, best first. The text is ``node_text``; the metadata holds
    the node's ``rank``, ``id``, ``name``, ``type``, ``score`` and ``step`` (as in ``RetrievedNode``), the
    ``dataset`` version that answered, ``triples``: the ``[head, relation, tail]`` names among the
    retrieved nodes whose head or tail is this node's name (a name shared by two retrieved nodes gets the
    triples of both), and ``provenance``: where each of those triples came from (``Hits.provenance``)."""
    if not hits.nodes:
        return []
    nodes = retriever.artifacts.dataset.nodes  # read once and kept by the dataset
    texts = nodes.column("text").take(pa.array([n.id for n in hits.nodes], pa.int64())).to_pylist()
    records = []
    for node, text in zip(hits.nodes, texts):
        mine = [i for i, t in enumerate(hits.triples) if node.name in (t[0], t[2])]
        metadata = {
            **node.to_dict(),
            "dataset": hits.dataset,
            "triples": [list(hits.triples[i]) for i in mine],
            "provenance": [hits.provenance[i] for i in mine] if hits.provenance else [],
        }
        records.append((node_text(node.name, text), metadata))
    return records
