"""seeder.data.subgraphs' sorted-key helpers, against numpy's own."""

import numpy as np

from seeder.data.subgraphs import isin_sorted


def test_isin_sorted_agrees_with_numpy_on_repeats_negatives_and_empty_arrays():
    rng = np.random.default_rng(3)
    for size, pool_size, high in ((1000, 300, 500), (5, 0, 10), (0, 7, 10), (2000, 2000, 10**15)):
        values, pool = rng.integers(-high, high, size), rng.integers(-high, high, pool_size)
        hits = min(10, pool_size, size)
        pool[:hits] = values[:hits]  # some certain hits
        assert np.array_equal(isin_sorted(values, pool), np.isin(values, pool)), (size, pool_size)
