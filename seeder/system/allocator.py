"""Keep freed memory in the process, so large batches stop faulting their pages back in.

glibc serves allocations above ``M_MMAP_THRESHOLD`` with fresh ``mmap``s and hands the top of its heap
back to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free. A batched rollout allocates and
frees hundreds of tensors of 0.1-10 MB per pass (edge messages, frontier tables), so with the defaults
every pass faults its working memory in again, page by page. Ranking 256 MetaQA questions took
46,000-92,000 minor page faults and 450-575 ms on this 2-core VM; with the settings below, none and
400 ms. Single questions allocate little and are unaffected; the training step, whose tensors autograd
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
