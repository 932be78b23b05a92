"""seeder/system/allocator.py: freed memory stays in the process instead of being faulted in again."""

import subprocess
import sys

import pytest

# Runs 20 passes of a batch's allocations, then prints the minor page faults they took.
CHURN = """
import resource, sys, torch
from seeder.system.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():  # a batched pass: tens of tensors of 1-10 MiB alive together (~100 MiB), then all freed
    parts = [torch.ones(n) for n in (1 << 18, 1 << 21, 1 << 19, 5 << 18) * 8]
    return sum(float(p.sum()) for p in parts)
for _ in range(5):  # the heap grows to its working size once
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str, env: dict | None = None) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensors_are_reused_without_page_faults():
    default, kept = faults("default"), faults("keep")
    # By default the freed heap top goes back to the kernel after every pass, to be faulted in again.
    assert default > 20 * 5_000
    assert kept < default / 20


def test_a_user_setting_is_left_alone(monkeypatch):
    from seeder.system import allocator

    allocator.keep_freed_memory.cache_clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    try:
        assert allocator.keep_freed_memory() is False
    finally:
        allocator.keep_freed_memory.cache_clear()
