"""seeder.data.subgraphs: the sorted-key helpers against numpy's own, and reading shards."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seeder.data.subgraphs import SUBGRAPH_SCHEMA, SubgraphSet, isin_sorted


def test_isin_sorted_agrees_with_numpy_on_repeats_negatives_and_empty_arrays():
    rng = np.random.default_rng(3)
    for size, pool_size, high in ((1000, 300, 500), (5, 0, 10), (0, 7, 10), (2000, 2000, 10**15)):
        values, pool = rng.integers(-high, high, size), rng.integers(-high, high, pool_size)
        hits = min(10, pool_size, size)
        pool[:hits] = values[:hits]  # some certain hits
        assert np.array_equal(isin_sorted(values, pool), np.isin(values, pool)), (size, pool_size)


def _shard(query_ids: list[int]) -> pa.Table:
    rows = [
        {
            "query_id": q,
            "split": "train",
            "nodes": [q, q + 1],
            "hop": [0, 1],
            "score": [1.0, 0.5],
            "is_answer": [False, True],
            "path_end": [0.0, 1.0],
            "edge_src": [0],
            "edge_dst": [1],
            "edge_rel": [q % 3],
            "answers": [q + 1],
        }
        for q in query_ids
    ]
    return pa.Table.from_pylist(rows, schema=SUBGRAPH_SCHEMA)


def test_read_orders_rows_by_query_id_whatever_the_order_of_the_shards(tmp_path):
    # A kept shard of an update ("part-kept-...") sorts after the recomputed ones but holds any ids.
    pq.write_table(_shard([5, 9]), tmp_path / "part-000000.parquet")
    pq.write_table(_shard([1, 7]), tmp_path / "part-kept-000000.parquet")
    mixed = SubgraphSet.read(tmp_path)
    assert mixed.query_ids.tolist() == [1, 5, 7, 9]
    assert mixed.nodes.tolist() == [1, 2, 5, 6, 7, 8, 9, 10] and mixed.edge_rel.tolist() == [1, 2, 1, 0]
    in_order = tmp_path / "in_order"
    in_order.mkdir()
    pq.write_table(_shard([1, 5]), in_order / "part-000000.parquet")
    pq.write_table(_shard([7, 9]), in_order / "part-000001.parquet")
    assert SubgraphSet.read(in_order).equals(mixed)
