"""Processes for tests: a web server on a free loopback port, a second process that holds an output
directory's lock (concurrent writers), a graceful stop, and ``bench_kill``, the fault benchmark whose kill of a whole process group the tests use."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest

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


def start_server(command: Callable[[int], list[str]], log: Path, tries: int = 3, **popen) -> tuple[subprocess.Popen, int]:
    """Start ``command(port)`` in its own session on a free loopback port, its output in ``log``; return it
    and the port once ``/health`` answers (up to 2 minutes).

    ``free_port`` closes the port before the server binds it, so another process may take it in between;
    uvicorn then logs "address already in use" and stays up without listening. Such a server is stopped
    and started again on a new port; any other failure fails the test with the log."""
    from tests.conftest import free_port

    for _ in range(tries):
        port = free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(command(port), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen)
        for _ in range(120):
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200 and not _lost_port(log):
                    return proc, port
            except OSError:
                if proc.poll() is not None or _lost_port(log):
                    break
                time.sleep(1)
        stop_session(proc)
        if not _lost_port(log):
            break
    pytest.fail(f"{command(port)[:4]} did not answer /health: {log.read_text(errors='replace')[-2000:]}")


def _lost_port(log: Path) -> bool:
    return "address already in use" in log.read_text(errors="replace").lower()


def stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM the process's whole session (a server and the workers it started), SIGKILL after 40 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
