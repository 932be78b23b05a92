"""The bfloat16 copy of the node features that K-HOP's filter reads on large graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seeder.config import ConfigError, ExpandConfig, load_config
from seeder.features import bfloat16
from seeder.preprocessing.stages import check_config, stage_fingerprints
from seeder.retrieve.khop import GraphIndex
from tests.retrieve.conftest import normalised, random_graph  # noqa: F401  (a fixture)
from tests.retrieve.test_khop import run


def test_rounding_matches_torch_bfloat16_and_widening_is_exact():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(20_000).astype(np.float32),
            np.float32([0.0, -0.0, 1.0, -1.0, 1e-30, 3.0e38, 1.00390625, 1.01171875]),  # ties to even, both ways
        ]
    )
    bits = bfloat16.to_bfloat16_bits(x)
    assert bits.dtype == np.uint16
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits, want)
    widened = bfloat16.from_bfloat16_bits(bits)
    np.testing.assert_array_equal(widened, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert np.abs(widened - x).max() <= np.abs(x).max() * 2.0**-8


def test_the_copy_streams_every_row_and_the_filter_reads_it(tmp_path, monkeypatch):
    monkeypatch.setattr(bfloat16, "_CHUNK_ROWS", 7)  # several chunks and a short last one
    nodes = normalised(np.random.default_rng(1), 30, 12)
    np.save(tmp_path / "node.npy", nodes)
    assert bfloat16.filter_features(tmp_path).dtype == np.float32  # no copy yet: node.npy
    bfloat16.write_copy(tmp_path)
    copy = bfloat16.filter_features(tmp_path)
    assert copy.dtype == np.uint16 and copy.shape == nodes.shape
    np.testing.assert_array_equal(copy, bfloat16.to_bfloat16_bits(nodes))


def test_only_graphs_from_the_threshold_get_the_copy_and_a_new_features_fingerprint():
    assert not bfloat16.applies(3_999_999, 4_000_000) and bfloat16.applies(4_000_000, 4_000_000)
    assert not bfloat16.applies(10**9, 0)  # 0: never
    config = load_config(None, [])
    small, large = stage_fingerprints(config, "d", 1_000), stage_fingerprints(config, "d", 5_000_000)
    assert small["embed"] == large["embed"] and small["features"] != large["features"]
    # Below the threshold the field is not part of the fingerprint: existing artifacts stay valid.
    moved = load_config(None, ["reduce.bfloat16_from_nodes=2000"])
    assert stage_fingerprints(moved, "d", 1_000)["features"] == small["features"]
    assert stage_fingerprints(moved, "d", 2_000)["features"] != small["features"]
    with pytest.raises(ConfigError, match="reduce.bfloat16_from_nodes must be >= 0"):
        check_config(load_config(None, ["reduce.bfloat16_from_nodes=-1"]))


def test_the_filter_reads_bfloat16_rows_as_the_float32_values_they_stand_for(random_graph):  # noqa: F811
    """Features that bfloat16 holds exactly give the same subgraphs, scores and edges from either file:
    the compiled filter widens each element exactly. Other features give nearly the same cosines."""
    kg, _, rng = random_graph
    nf = normalised(rng, kg.num_nodes, 32)
    rf, qf = normalised(rng, 2 * kg.num_relations, 32), normalised(rng, 9, 32)
    seeds = rng.integers(0, kg.num_nodes, (9, 2))
    cfg = ExpandConfig(budget=16, hops=2, keep_per_hop=[5, 9], batch_queries=4)
    graph = GraphIndex.build(kg)
    bits = bfloat16.to_bfloat16_bits(nf)
    exact = run(kg, bfloat16.from_bfloat16_bits(bits), rf, qf, seeds, cfg, graph=graph)
    copy = run(kg, bits, rf, qf, seeds, cfg, graph=graph)
    for name in ("node_ptr", "nodes", "hop", "score", "edge_ptr", "edge_src", "edge_dst", "edge_rel"):
        np.testing.assert_array_equal(getattr(copy, name), getattr(exact, name), err_msg=name)
    # Against the float32 rows themselves: the seeds' scores (their cosines) move by at most ~2^-8.
    full = run(kg, nf, rf, qf, seeds, cfg, graph=graph)
    seeds_full, seeds_copy = full.hop == 0, copy.hop == 0
    np.testing.assert_array_equal(full.nodes[seeds_full], copy.nodes[seeds_copy])
    np.testing.assert_allclose(copy.score[seeds_copy], full.score[seeds_full], atol=2.0**-7)
