"""seeder.data.ragged: the flat-and-offsets index arithmetic, against the per-list Python it replaces."""

import numpy as np

from seeder.data.ragged import offsets_of, positions_within, ranges, run_positions, segment_ids


def test_offsets_and_segment_ids_round_trip_with_empty_lists():
    lengths = np.array([2, 0, 3, 1])
    ptr = offsets_of(lengths)
    assert ptr.tolist() == [0, 2, 2, 5, 6] and ptr.dtype == np.int64
    assert segment_ids(ptr).tolist() == [0, 0, 2, 2, 2, 3]
    assert offsets_of(np.zeros(0, np.int64)).tolist() == [0] and segment_ids(np.array([0])).tolist() == []


def test_positions_ranges_and_runs_equal_their_per_list_loops():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 5, 50)
    starts = rng.integers(0, 1000, 50)
    assert positions_within(lengths).tolist() == [j for n in lengths for j in range(n)]
    assert ranges(starts, lengths).tolist() == [s + j for s, n in zip(starts, lengths) for j in range(n)]
    keys = np.sort(rng.integers(0, 10, 80))
    expected = [int((keys[:i] == k).sum()) for i, k in enumerate(keys)]
    assert run_positions(keys).tolist() == expected
    assert run_positions(np.zeros(0, np.int64)).tolist() == [] and ranges([], []).tolist() == []
