"""seeder.integrations.llamaindex: the LlamaIndex retriever returns the nodes of ``Retriever.retrieve``, in
its order and with its scores, as NodeWithScore; what an LLM reads of a node leaves the bookkeeping out;
the page's example runs (docs/integrations.md, "LlamaIndex")."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed: pip install -e '.[llamaindex]'")

from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402

from seeder.integrations.llamaindex import SeedERRetriever  # noqa: E402
from tests.integrations.docs import run_blocks  # noqa: E402


def _same_nodes(results, hits):
    assert all(isinstance(r, NodeWithScore) and isinstance(r.node, TextNode) for r in results)
    assert [r.node.id_ for r in results] == [str(n.id) for n in hits.nodes]
    assert [r.node.metadata["id"] for r in results] == [n.id for n in hits.nodes]
    assert [r.score for r in results] == [n.score for n in hits.nodes]
    assert [r.node.metadata["rank"] for r in results] == [n.rank for n in hits.nodes]


def test_nodes_are_the_retrievers_nodes_best_first(retriever, questions):
    adapter = SeedERRetriever(retriever, k=6)
    texts = retriever.artifacts.dataset.nodes.column("text").to_pylist()
    for question in questions:
        hits = retriever.retrieve(question, k=6)[0]
        results = adapter.retrieve(question)
        assert len(results) == 6
        _same_nodes(results, hits)
        for result, node in zip(results, hits.nodes):
            meta = result.node.metadata
            assert result.node.text.startswith(node.name) and texts[node.id] in result.node.text
            assert (meta["name"], meta["type"], meta["step"], meta["dataset"]) == (node.name, node.type, node.step, hits.dataset)
            assert [tuple(t) for t in meta["triples"]] == [t for t in hits.triples if node.name in (t[0], t[2])]
    _same_nodes(adapter.retrieve(QueryBundle(questions[0])), retriever.retrieve(questions[0], k=6)[0])


def test_what_an_llm_reads_of_a_node(retriever, questions):
    """The text, name, type and triples; not the rank, id, score, step or dataset version."""
    hits = retriever.retrieve(questions[0], k=10)[0]
    with_triples = next(i for i, n in enumerate(hits.nodes) if any(n.name in (t[0], t[2]) for t in hits.triples))
    node = SeedERRetriever(retriever, k=10).retrieve(questions[0])[with_triples].node
    content = node.get_content(metadata_mode=MetadataMode.LLM)
    assert node.text in content and f"type: {node.metadata['type']}" in content and "triples: " in content
    for hidden in ("rank", "id", "score", "step", "dataset", "provenance"):
        assert f"{hidden}: " not in content
    assert node.get_content(metadata_mode=MetadataMode.EMBED) == content


def test_filters_load_and_the_async_path(retriever, hand_built, questions):
    question = questions[0]
    filtered = SeedERRetriever(retriever, k=4, types=["place"]).retrieve(question)
    _same_nodes(filtered, retriever.retrieve(question, k=4, types=["place"])[0])
    assert filtered and {r.node.metadata["type"] for r in filtered} == {"place"}
    loaded = SeedERRetriever.load(hand_built[1], k=3)
    _same_nodes(loaded.retrieve(question), retriever.retrieve(question, k=3)[0])
    _same_nodes(asyncio.run(loaded.aretrieve(question)), retriever.retrieve(question, k=3)[0])


def test_the_pages_example_runs(retriever, hand_built, capsys):
    namespace = run_blocks("LlamaIndex", hand_built[1])
    _same_nodes(namespace["nodes"], retriever.retrieve(namespace["question"], k=10)[0])
    assert namespace["nodes"][0].node.text in capsys.readouterr().out
