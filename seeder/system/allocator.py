"""Keep freed memory in the process, so large batches stop faulting their pages back in.

glibc serves allocations above ``M_MMAP_THRESHOLD`` with fresh ``mmap``s and hands the top of its heap
back to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free. A batched rollout allocates and
frees hundreds of tensors of up to megabytes per pass (edge messages, frontier tables), so with the defaults
every pass faults its working memory in again, page by page. Ranking 256 MetaQA questions took
tens of thousands of minor page faults; with the settings below, none, and 1.1-1.4x less time
(benchmarks/RESULTS.md). Single questions allocate little and are unaffected; the training step, whose tensors autograd
keeps alive across the step, measured the same either way.

The cost is resident memory: the process keeps its peak heap instead of returning it. Both settings
are left alone where the user set them (``MALLOC_*_`` or ``GLIBC_TUNABLES`` in the environment) and
on C libraries without ``mallopt`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""Largest allocation served from the heap: glibc's ceiling for this setting on 64-bit."""
TRIM_THRESHOLD = 1 << 30
"""Free heap top kept before any is returned to the kernel."""

_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); whether they were set."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
