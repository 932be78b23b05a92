"""pipelines/ray_runtime.py: the embedded Ray listens on loopback only (checked with ``ss`` while it works),
and the Ray processes a killed driver leaves behind are stopped by the next run, without touching a live
session. Also ``seeder ui``'s MLflow server. Every listener of preprocessing, of two-worker training and of
a sweep is checked while the tests of those jobs run them (tests/pipelines/test_preprocess.py,
tests/pipelines/test_train.py, tests/tune/test_sweep.py)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.ray_runtime import CORE_PROCESSES
from tests.conftest import ENV
from tests.processes import start_server, stop_gracefully, stop_session
from tests.sockets import (
    assert_ray_listened_on_loopback_only,
    descendants,
    is_loopback,
    linux_only,
    listeners,
    needs_ss,
    watch_command,
)

REPO = Path(__file__).resolve().parents[2]

# A driver that starts Ray the way every entry point does, runs tasks and a Ray Data job, and then, with
# `hold`, stays up until killed.
DRIVER = """
import os, signal, sys, time
# The tests stop a holding driver with SIGINT (tests.processes.stop_gracefully). Under a test run that a
# script started in the background (`make test &`), it would inherit SIGINT ignored and be killed only after
# stop_gracefully's minute.
signal.signal(signal.SIGINT, signal.default_int_handler)
from pipelines.ray_runtime import start_ray
ray = start_ray(num_cpus=2, who="driver")
@ray.remote
def plus_one(x):
    return x + 1
assert ray.get([plus_one.remote(i) for i in range(4)]) == [1, 2, 3, 4]
import ray.data
assert ray.data.range(200, override_num_blocks=4).map_batches(lambda b: {"id": b["id"] * 2}).sum("id") == 39800
print("node", ray.util.get_node_ip_address(), flush=True)
print("ready", flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(600)
"""


def driver_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(ENV, RAY_raylet_start_wait_time_s="180", PYTHONPATH=path)
    env.pop("RAY_ADDRESS", None)
    return env


def start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def running(processes: dict[int, str | None]) -> set[int]:
    """Those of ``processes`` (pid -> start time) that still run and are the same processes (not a reused pid)."""
    alive = set()
    for pid, started in processes.items():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and start_time(pid) == started:
            alive.add(pid)
    return alive


def wait_ready(proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.strip() == "ready":
            return
    proc.kill()
    pytest.fail("the driver did not get ready:\n" + "".join(lines)[-3000:])


def test_loopback_addresses():
    for address in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(address), address
    for address in ("*", "0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1", "fe80::1%eth0", ""):
        assert not is_loopback(address), address


@pytest.mark.slow
@needs_ss
@linux_only
def test_seeder_ui_listens_on_loopback_only(tmp_path):
    env = dict(ENV, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    seeder = str(Path(sys.executable).parent / "seeder")
    proc, port = start_server(lambda port: [seeder, "ui", "--port", str(port)], tmp_path / "ui.log", cwd=tmp_path, env=env)
    try:
        tree = descendants(proc.pid)
        mine = [sock for sock in listeners() if sock.pid in tree]
        assert port in {sock.port for sock in mine}
        assert all(is_loopback(sock.address) for sock in mine), "\n".join(map(str, mine))
        commands = [
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in tree if Path(f"/proc/{pid}").exists()
        ]
        assert not [c for c in commands if b"huey" in c], "seeder ui started MLflow's job runner"
    finally:
        stop_session(proc)  # the UI and its workers: their own session


@pytest.mark.slow
@needs_ss
@linux_only
def test_the_next_embedded_ray_stops_what_a_killed_driver_left_spares_a_live_session_and_listens_on_loopback():
    """Three drivers: one that holds its session, one killed, and the next run, which must stop what the
    killed one left, leave the live session alone, and, like every embedded Ray, listen on loopback only."""
    env = driver_env()
    live = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "hold"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "hold"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    killed_tree: dict[int, str | None] = {}
    try:
        wait_ready(live)
        wait_ready(killed)
        live_tree = {pid: start_time(pid) for pid in descendants(live.pid) - {live.pid}}
        # Ray itself may retire an idle worker ("ray::IDLE") of the live session at any time, and a process
        # caught between fork and exec has no command line yet: compare its GCS, raylet and agents, which
        # live as long as the session.
        live_commands = {pid: command(pid) for pid in live_tree}
        live_core = {
            pid: started
            for pid, started in live_tree.items()
            if live_commands[pid] and not live_commands[pid].startswith("ray::")
        }
        killed_tree = {pid: start_time(pid) for pid in descendants(killed.pid) - {killed.pid}}
        assert len(killed_tree) >= 4  # GCS, raylet, agents, workers
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        # Its agents and workers often linger for a minute or more, but not always: some exit on their
        # own within seconds. Frozen, they surely are still there when the next run starts.
        core = {pid for pid in killed_tree if os.path.basename(command(pid).split(" ", 1)[0]) in CORE_PROCESSES}
        for pid in running(killed_tree) - core:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 60  # the GCS and raylet die with their driver
        while running({pid: killed_tree[pid] for pid in core}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running(killed_tree) - core, "nothing of the killed driver's Ray was left to find"

        done, watch = watch_command([sys.executable, "-c", DRIVER], timeout=400, env=env, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "node 127.0.0.1" in done.stdout
        assert_ray_listened_on_loopback_only(watch, "an embedded Ray")
        assert not running(killed_tree), f"left running: {sorted(running(killed_tree))}\n{done.stderr[-2000:]}"
        # The agents were still there when the next run started, and it stopped them: nothing of the live
        # session among them.
        notice = next(line for line in done.stderr.splitlines() if "left by an earlier run that was killed" in line)
        stopped = {int(pid) for pid in notice.split("(pids ")[1].rstrip(")").split(", ")}
        assert stopped <= set(killed_tree) and not stopped & set(live_tree), notice
        gone = [live_commands[pid][:80] for pid in set(live_core) - running(live_core)]
        assert len(live_core) >= 2 and not gone, f"a live session's processes were stopped: {gone}"
        assert live.poll() is None
    finally:
        for pid in running(killed_tree):  # frozen leftovers the next run did not stop
            os.kill(pid, signal.SIGKILL)
        for proc in (live, killed):
            stop_gracefully(proc)


def test_forwarded_worker_lines_carry_no_colour_codes_into_a_pipe():
    # A worker's print reaches the driver's output prefixed "(task pid=...)"; written to a pipe or a log
    # file, that prefix must not come wrapped in ANSI escape codes.
    driver = """
from pipelines.ray_runtime import start_ray
ray = start_ray(num_cpus=1, who="driver")
@ray.remote
def speak():
    print("hello from a worker", flush=True)
# Forwarded output arrives asynchronously (the log monitor polls the worker's file): wait for it.
import threading, time
from ray._private.ray_logging import global_worker_stdstream_dispatcher
arrived = threading.Event()
global_worker_stdstream_dispatcher.add_handler(
    "wait_for_hello", lambda data: any("hello from a worker" in line for line in data["lines"]) and arrived.set())
ray.get(speak.remote())
arrived.wait(120)
time.sleep(0.5)  # the printing handler runs beside this one
"""
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300, env=driver_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "hello from a worker" in line]
    assert lines and "(speak pid=" in lines[0], done.stdout[-2000:] + done.stderr[-2000:]
    assert not any("\x1b[" in line for line in lines), lines


def test_forwarded_core_worker_noise_is_dropped_and_other_lines_kept():
    # The driver's handler of forwarded worker output is wrapped once; the C++ "constructor arguments
    # in the object store and max_restarts > 0" line goes, everything else reaches the handler.
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from pipelines.ray_runtime import filter_forwarded_worker_lines

    received = []
    dispatcher.add_handler("ray_print_logs", received.append)
    try:
        assert filter_forwarded_worker_lines()
        assert not filter_forwarded_worker_lines()  # already wrapped
        noise = (
            "[2026-11-25 06:36:25,941 E 15043 15072] core_worker.cc:2465: Actor with class name: "
            "'PreemptionWatcher' and ID: '417ae7' has constructor arguments in the object store and "
            "max_restarts > 0. If the arguments in the object store go out of scope ..."
        )
        dispatcher.emit({"lines": [noise, "epoch 1/3  loss 0.1"], "pid": 1, "is_err": True})
        dispatcher.emit({"lines": [noise], "pid": 1, "is_err": True})
        assert [d["lines"] for d in received] == [["epoch 1/3  loss 0.1"]]
    finally:
        dispatcher.remove_handler("ray_print_logs")


WORKER_HOOK_PROBE = """
import importlib, logging, sys
from pipelines.ray_runtime import COORDINATOR_MODULE, COORDINATOR_REPLY_S, quiet_ray_loggers
quiet_ray_loggers()
imported = sorted(m for m in sys.modules if m.startswith("ray.train"))
from ray.train.v2._internal.execution import context
coordinator = importlib.import_module(COORDINATOR_MODULE)
print(imported, coordinator.AUTOSCALING_REQUESTS_GET_TIMEOUT_S, COORDINATOR_REPLY_S, context.logger.level == logging.WARNING)
"""


def test_the_worker_hook_imports_no_ray_train_yet_sets_its_controllers_wait_and_quiets_its_reports():
    """Every Ray worker runs the hook. On a loaded machine the coordinator actor took more than Ray's 5 s to
    answer Ray Train's controller, which printed a traceback: the hook gives it longer, and quiets the
    per-report log lines, once Ray Train is imported and without importing it (a second of each worker's
    start-up). A fresh interpreter: this one may have imported Ray Train already."""
    done = subprocess.run([sys.executable, "-c", WORKER_HOOK_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    imported, timeout, wanted, quiet = done.stdout.strip().rsplit(" ", 3)
    assert imported == "[]", imported
    assert int(timeout) == int(wanted) > 5 and quiet == "True", done.stdout


def test_the_worker_hook_sets_the_wait_at_once_where_ray_train_is_imported(monkeypatch):
    from pipelines.ray_runtime import COORDINATOR_MODULE, COORDINATOR_REPLY_S, quiet_ray_loggers

    coordinator = importlib.import_module(COORDINATOR_MODULE)

    monkeypatch.setattr(coordinator, "AUTOSCALING_REQUESTS_GET_TIMEOUT_S", 5)
    quiet_ray_loggers()
    assert coordinator.AUTOSCALING_REQUESTS_GET_TIMEOUT_S == COORDINATOR_REPLY_S > 5


def test_cluster_address_is_the_explicit_one_then_ray_address_and_local_means_none(monkeypatch):
    from pipelines.ray_runtime import cluster_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None and cluster_address("local") is None
    assert cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # what `ray job submit` sets
    assert cluster_address(None) == "10.0.0.2:6379"
    assert cluster_address("local") is None  # an explicit local wins over the environment


def test_ray_trains_controller_polls_four_times_a_second_unless_the_user_chose():
    """Every Ray job's runtime environment carries the controller's poll interval to the controller's
    process (on a cluster it does not inherit the driver's environment), and a user's value wins."""
    probe = "from pipelines.ray_runtime import RUNTIME_ENV; print(RUNTIME_ENV['env_vars']['RAY_TRAIN_HEALTH_CHECK_INTERVAL_S'])"
    env = {k: v for k, v in ENV.items() if k != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"}
    default = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    chosen = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "3"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert (default.stdout.strip(), chosen.stdout.strip()) == ("0.5", "3")
