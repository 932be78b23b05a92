"""seeder.integrations.langchain: the LangChain retriever returns the nodes of ``Retriever.retrieve``, in
its order and with its scores, as Documents; the retriever tool answers with their names; the page's
examples run (docs/integrations.md, "LangChain")."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="the langchain extra is not installed: pip install -e '.[langchain]'")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.tools import create_retriever_tool  # noqa: E402

from seeder.integrations.langchain import SeedERRetriever  # noqa: E402
from tests.integrations.docs import run_blocks  # noqa: E402


def _same_nodes(docs, hits):
    assert all(isinstance(doc, Document) for doc in docs)
    assert [d.metadata["id"] for d in docs] == [n.id for n in hits.nodes]
    assert [d.metadata["score"] for d in docs] == [n.score for n in hits.nodes]
    assert [d.metadata["rank"] for d in docs] == [n.rank for n in hits.nodes]


def test_documents_are_the_retrievers_nodes_best_first(retriever, questions):
    adapter = SeedERRetriever(retriever=retriever, k=6)
    names = retriever.artifacts.dataset.nodes.column("name").to_pylist()
    texts = retriever.artifacts.dataset.nodes.column("text").to_pylist()
    for question in questions:
        hits = retriever.retrieve(question, k=6)[0]
        docs = adapter.invoke(question)
        assert len(docs) == 6
        _same_nodes(docs, hits)
        for doc, node in zip(docs, hits.nodes):
            assert doc.metadata["name"] == node.name == names[node.id]
            assert doc.page_content.startswith(node.name) and texts[node.id] in doc.page_content
            assert {k: doc.metadata[k] for k in ("type", "step")} == {"type": node.type, "step": node.step}
            assert doc.metadata["dataset"] == hits.dataset == retriever.dataset_version != ""
            triples = [tuple(t) for t in doc.metadata["triples"]]
            assert triples == [t for t in hits.triples if node.name in (t[0], t[2])]
            mine = [s for t, s in zip(hits.triples, hits.provenance) if node.name in (t[0], t[2])]
            assert doc.metadata["provenance"] == mine and all(s["dataset"] == hits.dataset for s in mine)
        # Every triple among the retrieved nodes is in the metadata of its head and of its tail.
        assert {tuple(t) for d in docs for t in d.metadata["triples"]} == set(hits.triples)


def test_filters_k_load_and_the_async_and_batch_paths(retriever, hand_built, questions):
    question = questions[0]
    filtered = SeedERRetriever(retriever=retriever, k=4, types=["place"]).invoke(question)
    _same_nodes(filtered, retriever.retrieve(question, k=4, types=["place"])[0])
    assert filtered and {d.metadata["type"] for d in filtered} == {"place"}

    loaded = SeedERRetriever.load(hand_built[1], k=3, types=["entity"])
    docs = loaded.invoke(question)
    _same_nodes(docs, retriever.retrieve(question, k=3, types=["entity"])[0])

    adapter = SeedERRetriever(retriever=retriever, k=5)
    _same_nodes(asyncio.run(adapter.ainvoke(question)), retriever.retrieve(question, k=5)[0])
    # batch runs the questions on threads; they take turns on the one Retriever.
    for docs, question in zip(adapter.batch(questions), questions):
        _same_nodes(docs, retriever.retrieve(question, k=5)[0])


def test_the_retriever_tool_answers_with_the_node_names(retriever, questions):
    tool = create_retriever_tool(SeedERRetriever(retriever=retriever, k=5), "knowledge_graph", "Entities of the graph.")
    answer = tool.invoke({"query": questions[1]})
    assert isinstance(answer, str)
    # One paragraph per node, best first, each opening with the node's name.
    names = [n.name for n in retriever.retrieve(questions[1], k=5)[0].nodes]
    assert [paragraph.splitlines()[0] for paragraph in answer.split("\n\n")] == names


def test_the_pages_examples_run(retriever, hand_built, capsys):
    namespace = run_blocks("LangChain", hand_built[1])
    _same_nodes(namespace["docs"], retriever.retrieve(namespace["question"], k=10)[0])
    hits = retriever.retrieve("who directed Kismet", k=10)[0]
    assert all(n.name in namespace["answer"] for n in hits.nodes)
    assert namespace["docs"][0].page_content in capsys.readouterr().out
