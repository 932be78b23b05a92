"""Torch's and the BLAS libraries' thread counts, set for a block of code.

Fewer threads for small products (a single question ranks faster on one thread), and a fixed count
where a result must not depend on the machine: a different count splits a sum differently, and the
last bits of a trained model with it.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

from threadpoolctl import ThreadpoolController


@contextmanager
def intra_op_threads(count: int | None):
    """Torch's intra-op threads and numpy's BLAS threads set to ``count`` inside (None: left as they
    are), and the caller's settings back afterwards."""
    import torch  # torch only on this path

    if count is None:
        yield
        return
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        with blas_libraries().limit(limits=count):
            yield
    finally:
        if count != before:
            torch.set_num_threads(before)


@lru_cache(maxsize=1)
def blas_libraries():
    """threadpoolctl's handle on the BLAS libraries loaded in this process (found once: 0.8 ms; a
    limit set and undone through it costs microseconds)."""
    return ThreadpoolController().select(user_api="blas")
