"""seeder.system.mapped: a read or written range of a memmap leaves this process's resident set and keeps its
contents; anything but a shared file mapping is left alone; a mapping's resident bytes, and the process's
file-backed total (which the read test measures with), are measured."""

import sys

import numpy as np
import pytest

from seeder.system.mapped import file_resident_bytes, release, resident_bytes, take_rows

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")

MB = 1 << 20


def test_released_read_range_leaves_the_resident_set_and_reads_back(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(16 * MB // 4, dtype=np.float32))
    mapped = np.load(path, mmap_mode="r")
    before = file_resident_bytes()
    total = float(mapped.sum(dtype=np.float64))  # touches every page
    assert file_resident_bytes() - before > 12 * MB
    assert release(mapped[: len(mapped) // 2]) and release(mapped[len(mapped) // 2 :])
    assert file_resident_bytes() - before < 2 * MB
    assert float(mapped.sum(dtype=np.float64)) == total  # faulted back in from the page cache


def test_released_written_pages_are_kept(tmp_path):
    path = tmp_path / "w.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(4 * MB // 4,))
    out[:] = np.arange(len(out), dtype=np.float32)
    assert release(out[1000:])  # unaligned start: the page it shares with row 999 goes too
    assert out[999] == 999 and out[-1] == len(out) - 1
    del out
    assert np.array_equal(np.load(path), np.arange(4 * MB // 4, dtype=np.float32))


def test_private_or_anonymous_memory_is_left_alone(tmp_path):
    path = tmp_path / "c.npy"
    np.save(path, np.ones(MB // 4, dtype=np.float32))
    private = np.load(path, mmap_mode="c")
    private[:10] = 5  # copy-on-write changes would be lost by MADV_DONTNEED
    assert not release(private)
    assert (private[:10] == 5).all()
    anonymous = np.full(MB // 4, 7, dtype=np.float32)
    assert not release(anonymous)
    assert (anonymous == 7).all()
    assert not release(np.load(path, mmap_mode="r")[::2])  # not contiguous


def test_resident_bytes_follow_what_the_process_touched_and_released(tmp_path):
    path = tmp_path / "r.npy"
    np.save(path, np.ones(32 * MB // 4, dtype=np.float32))
    mapped = np.load(path, mmap_mode="r")
    release(mapped)
    assert resident_bytes(mapped) < MB
    float(mapped[: len(mapped) // 4].sum())  # touches the first quarter
    # The kernel maps a little around each fault (and whole large folios), never the untouched rest.
    assert 8 * MB <= resident_bytes(mapped) <= 16 * MB
    assert resident_bytes(mapped[len(mapped) // 2 :]) == resident_bytes(mapped)  # the whole mapping's, from any view
    release(mapped)
    assert resident_bytes(mapped) < MB
    assert resident_bytes(np.ones(10)) is None


def test_rows_taken_at_random_come_out_in_order_without_the_whole_file_mapped(tmp_path):
    """2% of the rows at random: plain fancy indexing maps nearly every page (the kernel maps the cached
    pages around each fault); ``take_rows`` holds at most a stretch of the file at a time."""
    path = tmp_path / "t.npy"
    np.save(path, np.arange(64 * MB // 4, dtype=np.float32).reshape(-1, 256))  # 64 MB, 1 KB rows
    mapped = np.load(path, mmap_mode="r")
    rows = np.random.default_rng(0).choice(len(mapped), len(mapped) // 50, replace=False)  # unsorted
    float(mapped.sum(dtype=np.float64))  # every page in the page cache, as after a write
    release(mapped)
    before = file_resident_bytes()
    taken = take_rows(mapped, rows, span_bytes=4 * MB)
    assert file_resident_bytes() - before < 8 * MB
    np.testing.assert_array_equal(taken, np.asarray(mapped)[rows])
    release(mapped)
    plain = file_resident_bytes()
    np.testing.assert_array_equal(mapped[np.sort(rows)], np.sort(taken, axis=0))
    assert file_resident_bytes() - plain > 32 * MB  # what the plain read holds: most of the 64 MB
    assert take_rows(np.arange(10.0), np.array([3, 1])).tolist() == [3.0, 1.0]
