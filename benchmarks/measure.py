"""Shared by the benchmark scripts: run a command and measure its wall time and peak memory, or run
one into a log file.

Peak memory is the largest summed RSS of the process and all its descendants, sampled every 0.5 s,
so Ray's raylet, object store and worker processes are counted, not only the driver.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def peak_tree_rss(pid: int, stop: threading.Event, result: dict, phases: list | None = None) -> None:
    """Sample the summed RSS of a process and all its descendants (Ray workers included), the largest
    RSS of any one of them (``peak_process_rss``), and the largest of their RSS less its file-backed
    shared pages (``peak_process_anon``): memory-mapped features count in a reader's RSS, though the
    page cache holds them once for every process and can drop them. ``peak_process_title`` names the
    process of the largest RSS (a Ray worker's title names its task, e.g. ``ray::on_node``).

    With ``phases`` (a list whose last entry is the open phase's dict, appended to by the reader of
    the command's output), each sample also raises that phase's own three peaks, so that the largest
    process of each stage is known, not only of the whole command."""
    import psutil

    peak = peak_process = peak_anon = 0
    title = ""
    root = psutil.Process(pid)
    while not stop.is_set():
        try:
            total = 0
            phase = phases[-1] if phases else None
            for proc in [root, *root.children(recursive=True)]:
                try:
                    info = proc.memory_info()
                except psutil.Error:
                    continue
                total += info.rss
                anon = info.rss - getattr(info, "shared", 0)
                if info.rss > peak_process or (phase is not None and info.rss > phase["peak_process_rss"]):
                    try:
                        name = " ".join(proc.cmdline())[:80] or proc.name()
                    except psutil.Error:
                        name = ""
                    if info.rss > peak_process:
                        peak_process, title = info.rss, name
                    if phase is not None and info.rss > phase["peak_process_rss"]:
                        phase["peak_process_rss"], phase["peak_process_title"] = info.rss, name
                peak_anon = max(peak_anon, anon)
                if phase is not None:
                    phase["peak_process_anon"] = max(phase["peak_process_anon"], anon)
            peak = max(peak, total)
            if phase is not None:
                phase["peak_rss"] = max(phase["peak_rss"], total)
        except psutil.Error:
            break
        time.sleep(0.5)
    result["peak_rss"] = peak
    result["peak_process_rss"] = peak_process
    result["peak_process_anon"] = peak_anon
    result["peak_process_title"] = title


def _phase(name: str | None = None) -> dict:
    return {"name": name, "peak_rss": 0, "peak_process_rss": 0, "peak_process_anon": 0, "peak_process_title": ""}


def run_measured(cmd: list[str], echo: bool = True, quiet_tags=(" INFO ", "WARNING", "logging_progress"), phase_end=None):
    """Run ``cmd``; return (exit code, wall seconds, peak tree RSS in bytes, output lines). The largest
    RSS of any one process of the tree is in ``run_measured.last_peak_process`` afterwards, and without
    its file-backed shared pages in ``run_measured.last_peak_anon``; that process's command line in
    ``run_measured.last_peak_title``.

    ``phase_end(line)`` names the phase an output line ends (preprocessing's ``seeds: ... in 9.1 s``
    ends ``seeds``), or returns None: the samples up to that line count for that phase, and
    ``run_measured.last_phases`` lists each phase's peaks (``name``, ``peak_rss``, ``peak_process_rss``,
    ``peak_process_anon``, ``peak_process_title``), the samples after the last named line under ``None``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, mem = threading.Event(), {}
    phases = [_phase()] if phase_end is not None else None
    sampler = threading.Thread(target=peak_tree_rss, args=(proc.pid, stop, mem, phases))
    sampler.start()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if echo and not any(tag in line for tag in quiet_tags):
            sys.stdout.write("    " + line)
            sys.stdout.flush()
        ended = phase_end(line) if phase_end is not None else None
        if ended is not None:
            phases[-1]["name"] = ended
            phases.append(_phase())  # the sampler moves on to the next phase with its next sample
    proc.wait()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    run_measured.last_peak_process = mem.get("peak_process_rss", 0)
    run_measured.last_peak_anon = mem.get("peak_process_anon", 0)
    run_measured.last_peak_title = mem.get("peak_process_title", "")
    run_measured.last_phases = phases or []
    return proc.returncode, wall, mem.get("peak_rss", 0), lines


def run_logged(command: list[str], log: Path) -> None:
    """Run one of the project's commands from the repository root, its output appended to ``log``; a
    failure stops the benchmark with the log's path and its last lines."""
    with open(log, "a") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(Path(log).read_text().splitlines(keepends=True)[-15:])
        sys.exit(f"{' '.join(command[1:4])} ... exited with {done.returncode}; its log is {log}:\n{tail}")
