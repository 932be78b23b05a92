"""The dense, K-HOP-W-FILTER and prior reference retrievers: full, deterministic rankings."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from seeder.config import ConfigError, SeederConfig
from seeder.retrieve import registry
from seeder.retrieve.khop import expand_queries
from seeder.retrieve.seeds import dense_seeds
from seeder.system.io import DataError

from .conftest import normalised


@pytest.fixture
def setup(random_graph):
    kg, _, rng = random_graph
    nf, rf, qf = normalised(rng, kg.num_nodes, 8), normalised(rng, 2 * kg.num_relations, 8), normalised(rng, 5, 8)
    config = SeederConfig()
    config.expand.budget, config.expand.keep_per_hop, config.eval.ranking_length = 12, [4, 8], 20
    seeds, scores = dense_seeds(qf, nf, 3)
    sg = expand_queries(
        kg,
        nf,
        rf,
        qf,
        seeds,
        scores,
        config.expand,
        np.arange(5) + 100,
        np.array(["val"] * 5, dtype=object),
        np.arange(6),
        np.arange(5) * 3,
    )
    return SimpleNamespace(node_features=nf), config, sg, qf, nf


def test_dense_ranking_is_full_and_exact(setup):
    artifacts, config, sg, qf, nf = setup
    res = registry.build("dense", artifacts, config).retrieve(sg, qf)
    assert res.ranking.shape == (5, 20) and (res.set_size == 12).all()
    np.testing.assert_array_equal(res.query_ids, sg.query_ids)
    want = np.argsort(-(qf @ nf.T), axis=1, kind="stable")[:, :20]
    np.testing.assert_array_equal(res.ranking, want)


def test_khop_ranking_subgraph_first_then_dense(setup):
    artifacts, config, sg, qf, nf = setup
    retriever = registry.build("khop", artifacts, config)
    res = retriever.retrieve(sg, qf)
    again = retriever.retrieve(sg, qf)
    np.testing.assert_array_equal(res.ranking, again.ranking)
    assert res.ranking.shape == (5, 20)
    dense = np.argsort(-(qf @ nf.T), axis=1, kind="stable")
    for q in range(5):
        row = res.ranking[q]
        assert (row >= 0).all() and len(set(row.tolist())) == len(row)  # full, no duplicates
        nodes = sg.nodes[sg.node_ptr[q] : sg.node_ptr[q + 1]]
        score = sg.score[sg.node_ptr[q] : sg.node_ptr[q + 1]]
        assert res.set_size[q] == len(nodes)
        by_score = nodes[np.lexsort((nodes, -score))]
        assert row[: len(nodes)].tolist() == by_score.tolist()
        rest = [n for n in dense[q] if n not in set(nodes.tolist())][: 20 - len(nodes)]
        assert row[len(nodes) :].tolist() == rest


def test_registry_unknown_method(setup):
    artifacts, config, *_ = setup
    assert {"dense", "khop"} <= set(registry.available())
    with pytest.raises(ConfigError, match="known: .*dense"):
        registry.build("nope", artifacts, config)


def test_prior_ranks_the_subgraph_by_path_end_seeds_last_then_dense(setup):
    artifacts, config, sg, qf, nf = setup
    rng = np.random.default_rng(0)
    # Path ends in a few distinct values, so that ties fall to the filter score.
    learned = replace(sg, path_end=-rng.integers(0, 3, len(sg.nodes)).astype(np.float32))
    res = registry.build("prior", artifacts, config).retrieve(learned, qf)
    khop = registry.build("khop", artifacts, config).retrieve(learned, qf)
    for q in range(5):
        lo, hi = sg.node_ptr[q], sg.node_ptr[q + 1]
        nodes, hop, score, end = learned.nodes[lo:hi], learned.hop[lo:hi], learned.score[lo:hi], learned.path_end[lo:hi]
        ranked = res.ranking[q, : len(nodes)]
        pos = {n: i for i, n in enumerate(nodes.tolist())}
        at = np.array([pos[n] for n in ranked.tolist()])
        assert (hop[at][: (hop > 0).sum()] > 0).all()  # every other node before the seeds
        assert (np.diff(end[at][: (hop > 0).sum()]) <= 0).all()  # path end never rises among them
        want = nodes[np.lexsort((nodes, -score, -end, hop == 0))]  # and within a path end, the filter score
        assert ranked.tolist() == want.tolist()
        assert set(ranked.tolist()) == set(khop.ranking[q, : len(nodes)].tolist())
        assert res.ranking[q, len(nodes) :].tolist() == khop.ranking[q, len(nodes) :].tolist()  # the same dense rest
    assert (res.set_size == khop.set_size).all()


def test_prior_refuses_subgraphs_of_the_cosine_filter(setup):
    artifacts, config, sg, qf, _ = setup
    with pytest.raises(DataError, match="expand.relation_score=learned"):
        registry.build("prior", artifacts, config).retrieve(replace(sg, path_end=np.zeros_like(sg.path_end)), qf)
