"""The approximate index of dense seeds: agreement with exact search, format, serialisation, and the
choice between the two (``seed.search``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from seeder.config import ConfigError, SeedConfig, SeederConfig, load_config
from seeder.preprocessing.stages import run_seeds, stage_fingerprints
from seeder.retrieve.ann import AnnIndex, check_ann_config, derived_nlist, search_block, topk_recall
from seeder.retrieve.seeds import dense_search, dense_seeds, resolve_search, seed_queries

from .conftest import make_graph, normalised


def clustered(rng: np.random.Generator, rows: int, centres: np.ndarray, spread: float) -> np.ndarray:
    x = centres[rng.integers(0, len(centres), rows)] + spread * rng.standard_normal((rows, centres.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def clustered_set():
    """20,000 nodes in 64 tight clusters in 32 dimensions; 600 queries near random nodes."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((64, 32))
    nodes = clustered(rng, 20_000, centres, 0.25)
    queries = nodes[rng.integers(0, len(nodes), 600)] + 0.05 * rng.standard_normal((600, 32)).astype(np.float32)
    return nodes, (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)


ANN = SeedConfig(search="ann", ann_nprobe=12)


def test_ann_top_k_equals_exact_on_clustered_features(clustered_set):
    nodes, queries = clustered_set
    cfg = dataclasses.replace(ANN, k0=5)
    index = AnnIndex.build(nodes, cfg)
    assert index.params.nlist == derived_nlist(cfg, len(nodes)) == 141  # sqrt(20,000)
    ids, scores = search_block(index, queries, cfg)
    want_ids, want_scores = dense_seeds(queries, nodes, 5)
    assert topk_recall(ids, want_ids) >= 0.99
    same = (ids == want_ids).all(axis=1)
    assert same.mean() >= 0.97
    # Where the index found the exact top-k: same order and the same scores (to float32 rounding, as
    # exact search with other block sizes).
    np.testing.assert_allclose(scores[same], want_scores[same], atol=1e-6)
    # Scanning every list is exact search.
    all_ids, all_scores = index.search(queries, 5, nprobe=index.params.nlist)
    np.testing.assert_array_equal(all_ids, want_ids)
    np.testing.assert_allclose(all_scores, want_scores, atol=1e-6)


def test_format_and_padding_match_dense_seeds_when_k_exceeds_the_nodes():
    rng = np.random.default_rng(0)
    nodes, queries = normalised(rng, 6, 8), normalised(rng, 4, 8)
    nodes[4] = nodes[1]  # a tie: the smaller id first, as in exact search
    cfg = SeedConfig(search="ann", k0=9, ann_nprobe=1)
    ids, scores = dense_search(queries, nodes, cfg)
    want_ids, want_scores = dense_seeds(queries, nodes, 9)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == (4, 9)
    np.testing.assert_array_equal(ids, want_ids)
    assert (ids[:, 6:] == -1).all() and np.isneginf(scores[:, 6:]).all()
    np.testing.assert_allclose(scores[:, :6], want_scores[:, :6], atol=1e-6)
    # No queries: empty rows of the same types.
    none_ids, none_scores = dense_search(np.zeros((0, 8), np.float32), nodes, cfg)
    assert none_ids.shape == (0, 9) and none_ids.dtype == np.int64 and none_scores.dtype == np.float32


def test_serialised_index_gives_identical_results(clustered_set):
    nodes, queries = clustered_set
    index = AnnIndex.build(nodes[:5_000], ANN)
    data = index.to_bytes()
    loaded = AnnIndex.from_bytes(data)
    assert loaded.params == index.params and loaded.info["nprobe"] == ANN.ann_nprobe
    want = index.search(queries, 3, nprobe=ANN.ann_nprobe, extra=ANN.ann_extra)
    for got in (
        loaded.search(queries, 3, nprobe=ANN.ann_nprobe, extra=ANN.ann_extra),
        search_block(data, queries, ANN),
        search_block(np.frombuffer(data, np.uint8), queries, ANN),
    ):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match="not a serialised"):
        AnnIndex.from_bytes(b"something else")


def test_auto_is_exact_below_the_node_threshold_and_for_small_batches():
    cfg = SeedConfig()
    assert cfg.search == "auto" and resolve_search(cfg, 43_234, 40_000) == "exact"  # MetaQA's size
    assert resolve_search(cfg, 1_000_000, 20_000) == "ann"
    assert resolve_search(cfg, 1_000_000, 5) == "exact"  # a few new questions: the build would not pay off
    assert resolve_search(cfg, 1_000_000, None) == "ann"  # a caller with an index
    assert resolve_search(dataclasses.replace(cfg, search="exact"), 10**7, 10**6) == "exact"
    assert resolve_search(dataclasses.replace(cfg, search="ann"), 10, 1) == "ann"
    # Below the threshold, auto seeds exactly, bit for bit.
    rng = np.random.default_rng(1)
    nodes, queries = normalised(rng, 500, 16), normalised(rng, 50, 16)
    config = SeederConfig(seed=dataclasses.replace(cfg, ann_min_nodes=501))
    ids, scores = seed_queries(None, config, queries, nodes)
    want = dense_seeds(queries, nodes, cfg.k0, cfg.block_nodes, cfg.block_queries)
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(scores, want[1])


@pytest.mark.parametrize(
    "override,key",
    [
        ("seed.search=fast", "seed.search"),
        ("seed.ann_nprobe=0", "seed.ann_nprobe"),
        ("seed.ann_nlist=-4", "seed.ann_nlist"),
        ("seed.ann_min_recall=1.5", "seed.ann_min_recall"),
        ("seed.ann_nlist_factor=0", "seed.ann_nlist_factor"),
    ],
)
def test_bad_values_are_config_errors_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_ann_config(load_config(None, [override]).seed)
    with pytest.raises(ConfigError):
        load_config(None, ["seed.ann_nprobe=many"])


def test_seeds_fingerprint_covers_search_settings_only_where_they_apply():
    def fp(num_nodes=None, **seed):
        return stage_fingerprints(load_config(None, [f"seed.{k}={v}" for k, v in seed.items()]), "d", num_nodes)["seeds"]

    exact = fp(search="exact")
    # Exact search ignores the index settings; auto on a graph below the threshold is exact search.
    assert fp(search="exact", ann_nprobe=64, block_nodes=999) == exact
    assert fp(43_234) == fp(43_234, ann_nprobe=64, ann_min_recall=0.5) == exact
    # With the index, its settings change the seeds.
    assert fp(search="ann") != exact
    assert fp(search="ann", ann_nprobe=64) != fp(search="ann")
    assert fp(search="ann", ann_seed=1) != fp(search="ann")
    assert fp(search="ann", ann_min_recall=0.5) == fp(search="ann")  # only auto falls back
    assert fp(search="ann", ann_nlist=100, ann_nlist_factor=3) == fp(search="ann", ann_nlist=100)
    assert fp(2_000_000) != fp(2_000_000, ann_nprobe=64) and fp(2_000_000) != exact
    assert fp() == fp(2_000_000)  # node count unknown: auto keys what it may depend on


def seeds_run(tmp_path, nodes, queries, **seed):
    n, q = len(nodes), len(queries)
    kg = make_graph(
        tmp_path / "kg",
        [0],
        [1],
        [0],
        n,
        1,
        queries=pa.table({"id": np.arange(q), "text": [f"q{i}" for i in range(q)], "answers": [[0]] * q, "split": ["val"] * q}),
    )
    features = tmp_path / "features"
    features.mkdir()
    np.save(features / "node.npy", nodes), np.save(features / "query.npy", queries)
    np.save(features / "query_ids.npy", np.arange(q))
    out = tmp_path / "seeds"
    out.mkdir()
    return run_seeds(features, out, kg, load_config(None, [f"seed.{k}={v}" for k, v in seed.items()]))


def test_run_seeds_reports_the_search_its_recall_and_falls_back(tmp_path, clustered_set):
    nodes, queries = clustered_set
    nodes, queries = nodes[:3_000], queries[:400]
    info = seeds_run(tmp_path / "ann", nodes, queries, search="ann", ann_nlist=20, ann_nprobe=20)
    assert info["search"] == "ann" and info["ann"]["recall"] == 1.0 and info["ann"]["sample_queries"] == 400
    assert info["ann"]["nlist"] == 20 and info["ann"]["nprobe"] == 20 and info["ann"]["index"] == "ivf_flat"
    small = seeds_run(tmp_path / "small", nodes, queries)  # auto, far below ann_min_nodes
    assert small["search"] == "exact" and "ann" not in small
    # auto with an index that loses seeds on the sample: exact search instead, and the info says so.
    rng = np.random.default_rng(5)
    info = seeds_run(
        tmp_path / "fallback",
        normalised(rng, 3_000, 32),
        normalised(rng, 400, 32),
        ann_min_nodes=1,
        ann_nlist=20,
        ann_nprobe=1,
        ann_min_recall=0.99,
    )
    assert info["search"] == "exact" and info["ann"]["fell_back_to_exact"] and info["ann"]["recall"] < 0.99
