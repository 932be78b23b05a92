"""Processes for tests: a second process that holds an output directory's lock (concurrent writers), a
graceful stop, and ``bench_kill``, the fault benchmark whose kill of a whole process group the tests use."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("bench_kill", REPO / "benchmarks" / "bench_kill.py")
bench_kill = importlib.util.module_from_spec(_spec)
"""benchmarks/bench_kill.py: the pipeline's commands, ``kill_group`` (SIGKILL a step's process group and the
Ray daemons it left) and the comparisons of a rerun with an uninterrupted run."""
_spec.loader.exec_module(bench_kill)

_HOLD = """
import sys, time
from seeder.system.io import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def stop_gracefully(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGINT (a Ray driver then runs ``ray.shutdown()``), SIGKILL after ``timeout``; closes its stdout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def lock_held_by_another_process(out: str | os.PathLike) -> Iterator[subprocess.Popen]:
    """Yield a live process that holds ``output_lock(out)``; it is killed with SIGKILL on exit, as a
    crashed writer would be, so whatever follows also shows that the kernel released the lock."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "locked", "the lock holder did not start"
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
