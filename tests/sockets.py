"""Which addresses a process tree listens on, read from ``ss``: for the loopback-only checks of Ray.

A watcher samples ``ss -ltunpH`` in a thread while a command runs, because Ray's workers, actors and
torch's rendezvous store come and go during a job: a single look at the end would miss them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Listener:
    proto: str  # tcp or udp
    address: str  # as ss prints it without brackets: 127.0.0.1, ::1, ::ffff:127.0.0.1, 0.0.0.0, *, 192.0.2.2
    port: int
    pid: int
    name: str  # the process's name at the time (ray::IDLE, gcs_server, python, ...)

    def __str__(self) -> str:
        return f"{self.proto} {self.address}:{self.port} pid {self.pid} ({self.name})"


def ss_available() -> bool:
    return shutil.which("ss") is not None


needs_ss = pytest.mark.skipif(not ss_available(), reason="`ss` (iproute2) is not installed: cannot list listening sockets")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 and the IPv4-mapped ::ffff:127.x.y.z; ``*``, 0.0.0.0, :: and any other address are not."""
    address = address.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv0 = handle.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return "?"
    return os.path.basename(argv0.split(" ", 1)[0]) if "/" in argv0.split(" ", 1)[0] else argv0


def parent_map() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_map().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def listeners() -> list[Listener]:
    """Every listening TCP socket and bound UDP socket whose owner ``ss`` can name."""
    out = subprocess.run(["ss", "-ltunpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        local = fields[4]
        host, _, port = local.rpartition(":")
        host = host.strip("[]")
        for pid in {int(p) for p in re.findall(r"pid=(\d+)", line)}:
            found.append(Listener(fields[0], host, int(port) if port.isdigit() else 0, pid, process_name(pid)))
    return found


class Watch:
    """Sample, every ``interval`` seconds until stopped, the sockets that the processes below ``root``
    listen on outside the loopback interface."""

    def __init__(self, root: int, interval: float = 0.3):
        self.root, self.interval = root, interval
        self.outside: dict[tuple, Listener] = {}
        self.inside: dict[tuple, Listener] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        tree = descendants(self.root)
        for sock in listeners():
            if sock.pid in tree:
                key = (sock.proto, sock.address, sock.port, sock.pid)
                (self.inside if is_loopback(sock.address) else self.outside).setdefault(key, sock)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except (OSError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def watch_command(args: list[str], timeout: float, **kwargs) -> tuple[subprocess.CompletedProcess, Watch]:
    """Run ``args`` to completion while watching its process tree's sockets (stdout and stderr captured
    apart, as ``subprocess.run(..., capture_output=True, text=True)`` does). Where ``ss`` or ``/proc`` is
    missing the watch sees nothing; the tests that read it skip there."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    with Watch(proc.pid) as watch:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{args} did not finish in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err), watch


def assert_ray_listened_on_loopback_only(watch: Watch, what: str) -> None:
    """The watched command ran a Ray (its GCS and raylet were seen listening) and nothing of it listened
    outside the loopback interface."""
    seen = {sock.name for sock in watch.inside.values()}
    assert {"gcs_server", "raylet"} <= seen, f"{what}: the watch saw no Ray listener ({watch.samples} samples): {seen}"
    assert not watch.outside, f"{what} listens outside loopback:\n" + "\n".join(map(str, watch.outside.values()))
