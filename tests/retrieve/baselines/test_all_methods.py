"""Every baseline: a full, deterministic ranking without repeats, independent of query batching."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from seeder.config import ConfigError, SeederConfig
from seeder.data.store import KnowledgeGraph
from seeder.retrieve.baselines import METHODS, run_baseline
from tests.retrieve.baselines.helpers import baselines_config

from .helpers import random_inputs

LENGTH = 40


@pytest.fixture(scope="module")
def inputs():
    return random_inputs(seed=11, n=300, q=9)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_full_deterministic_ranking_without_repeats(name, inputs):
    cfg = baselines_config(block_queries=4, ego__max_nodes=80, mmr__pool=50, mmr__select=10, astar__budget=15)
    first = run_baseline(name, inputs, cfg, LENGTH)
    assert first.query_ids.tolist() == inputs.query_ids.tolist()
    assert first.ranking.shape == (len(inputs.query_ids), LENGTH)
    assert (first.ranking >= 0).all() and (first.ranking < inputs.graph.num_nodes).all()
    for row in first.ranking:
        assert len(set(row.tolist())) == LENGTH
    assert (first.set_size >= 0).all() and (first.set_size <= LENGTH).all()
    if name != "bm25":  # BM25 may share no term with a query; every graph method retrieves its seeds
        assert (first.set_size >= 1).all()
    # Same inputs, different batching: identical output.
    again = run_baseline(name, inputs, dataclasses.replace(cfg, block_queries=64), LENGTH)
    np.testing.assert_array_equal(first.ranking, again.ranking)
    np.testing.assert_array_equal(first.set_size, again.set_size)
    # Beyond the retrieved set, the ranking follows dense cosine.
    cos = inputs.query_features @ inputs.node_features.T
    for i, row in enumerate(first.ranking):
        tail = row[first.set_size[i] :]
        if name in ("bm25", "hybrid", "ppr-mmr", "astar"):
            continue  # their own ranked pools extend past the retrieved set
        assert np.all(np.diff(cos[i, tail]) <= 1e-6)


def test_unknown_baseline_is_a_config_error(inputs):
    with pytest.raises(ConfigError, match="known: g-retriever"):
        run_baseline("nope", inputs)


def test_registry_builds_every_baseline(inputs):
    from seeder.retrieve import registry

    missing = set(METHODS) - set(registry.available())
    assert not missing, f"not registered: {missing}"

    class FakeDataset:
        graph = inputs.graph
        indptr, neighbors, edge_relations = graph.indptr, graph.neighbors, graph.edge_relations
        num_nodes, num_relations = graph.num_nodes, graph.num_relations

        class nodes:  # noqa: N801 - mimics KnowledgeGraph.nodes (a pyarrow table)
            @staticmethod
            def column(name):
                return SimpleNamespace(to_pylist=lambda: inputs.node_texts)

        class queries:  # noqa: N801
            @staticmethod
            def column(name):
                data = {"id": np.asarray(inputs.query_ids), "text": inputs.query_texts}[name]
                return SimpleNamespace(to_numpy=lambda: data, to_pylist=lambda: list(data))

        path = "fake"
        query_rows = KnowledgeGraph.query_rows  # the real id -> row lookup, over the fake table

    artifacts = SimpleNamespace(
        path="fake", dataset=FakeDataset(), node_features=inputs.node_features, relation_features=inputs.relation_features
    )
    config = SeederConfig()
    config.baselines.ego.max_nodes = 60
    subgraphs = SimpleNamespace(query_ids=inputs.query_ids[::-1].copy())
    for name in METHODS:
        retriever = registry.build(name, artifacts, config)
        result = retriever.retrieve(subgraphs, inputs.query_features[::-1])
        assert result.query_ids.tolist() == subgraphs.query_ids.tolist()
        direct = run_baseline(
            name, inputs.batch(np.arange(len(inputs.query_ids))[::-1]), config.baselines, result.ranking.shape[1]
        )
        np.testing.assert_array_equal(result.ranking, direct.ranking)
