"""Joining or starting Ray, shared by every entry point in pipelines/ and tune/.

An explicit address (``--ray-address``) or ``RAY_ADDRESS`` (which ``ray job submit`` sets) joins that
cluster. Otherwise the entry point starts an embedded local Ray bound to the loopback interface,
without a dashboard: it never silently joins an unrelated cluster that happens to run on the machine
(whose CPUs may all be taken, which would leave this job waiting forever).

The embedded Ray listens on 127.0.0.1 only (``loopback_only``), and before it starts, the Ray processes
that an earlier embedded run left behind when it was killed are stopped (``stop_leftover_ray``).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import logging
import os
import re
import signal
import sys
import time
import types
from typing import Callable

STARTUP_ATTEMPTS = 3
ADDRESS_HELP = (
    "Ray cluster to join (HOST:PORT or ray://HOST:PORT); 'local' starts an embedded Ray. Default: RAY_ADDRESS "
    "(ray job submit sets it), else an embedded local Ray on 127.0.0.1; a cluster already running on this "
    "machine is never joined unasked"
)
NUM_CPUS_HELP = "CPUs of an embedded local Ray (default: all of this machine's)"
# Ray's own loggers that flood the terminal without saying anything a user can act on: the placement
# group cleaner polls the State API, which needs the dashboard the embedded Ray runs without, and warns
# every few seconds that it cannot. (Ray Train's per-report INFO lines are not reachable this way: Ray
# Train configures its workers' logging after this hook runs.)
COORDINATOR_REPLY_S = 60
"""How long Ray Train's controller waits for the autoscaling coordinator's reply (``quiet_ray_loggers``)."""
QUIET_LOGGERS = {
    "ray.train.v2._internal.execution.controller.placement_group_cleaner": "ERROR",
}
# The driver's routine notices: the token-auth default (token auth stays on), Ray Data's "progress bars
# disabled" (we draw our own, seeder/system/progress.py) and its start/finish lines per dataset. Warnings and
# errors of these loggers still show; everything is in the session's log folder, printed at start-up.
QUIET_DRIVER_LOGGERS = {
    "ray._private.authentication.authentication_token_setup": "ERROR",
    "ray.data._internal.progress": "ERROR",
    "ray.data._internal.execution.streaming_executor": "WARNING",
}


COORDINATOR_MODULE = "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"


def quiet_ray_loggers() -> None:
    """``worker_process_setup_hook``: runs in every Ray worker process before it does any work.

    It imports nothing of Ray Train: most workers never use it, and importing it (pandas, pydantic and
    hundreds of other modules) cost each of them about a second of CPU at start-up."""
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    # Ray's State API (used by Ray Train's placement-group cleaner) finds "the" local cluster by looking
    # for running ones, and raised a ConnectionError traceback whenever a second Ray ran on the machine.
    import ray

    if ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    # Ray Train's "Reporting training result N: TrainingReport(...)" (all metrics, every epoch and rank)
    # comes from a logger named by its file's path, which LoggingConfig's level does not reach.
    context = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution", "context.py")
    logging.getLogger(context).setLevel(logging.WARNING)
    # Ray Train's controller registers each run with Ray Data's autoscaling coordinator, an actor started on
    # first use, and gives its reply 5 s: on a loaded machine the actor's start takes longer, and the
    # controller printed a "safe to ignore" traceback. It waits for the actor instead, up to a limit.
    after_import(COORDINATOR_MODULE, wait_longer_for_the_coordinator)


def wait_longer_for_the_coordinator(coordinator) -> None:
    timeout = getattr(coordinator, "AUTOSCALING_REQUESTS_GET_TIMEOUT_S", None)
    if isinstance(timeout, (int, float)):  # a Ray without it: nothing to change
        coordinator.AUTOSCALING_REQUESTS_GET_TIMEOUT_S = max(timeout, COORDINATOR_REPLY_S)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``name`` is imported, it lets the other finders find it and has its
    loader call ``then(module)`` once the module has run."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run_module = spec.loader.exec_module

            def run_then(module):
                run_module(module)
                self.then(module)

            spec.loader.exec_module = run_then  # this spec's own loader: nothing shared is changed
        return spec


def after_import(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """``then(module)`` now if ``name`` is imported already, else right after it is, without importing it."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


# HF_HUB_DISABLE_PROGRESS_BARS: each embedding actor would otherwise draw a "Loading weights" bar.
# RAY_TRAIN_ENABLE_PRINT_PATCH=0: Ray Train would send a worker's print both to its stdout and through
# the root logger, so every epoch line reached the terminal twice.
# RAY_TRAIN_HEALTH_CHECK_INTERVAL_S: every step of a run (workers up, each report, the end) waits for
# Ray Train's controller to look at its workers again, by default every two seconds; four looks a second
# end a small two-worker training about 18% sooner (benchmarks/RESULTS.md). A value the user set is kept.
TRAIN_HEALTH_CHECK = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
RUNTIME_ENV = {
    "worker_process_setup_hook": "pipelines.ray_runtime.quiet_ray_loggers",
    "env_vars": {
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        TRAIN_HEALTH_CHECK: os.environ.get(TRAIN_HEALTH_CHECK, "0.5"),
    },
}


# Ray's C++ core worker logs one ERROR line for every actor whose constructor arguments sit in the
# object store and that may be restarted (ray-project/ray#53727): Ray Train's PreemptionWatcher and
# Ray Data's actor pools hit it on every run, and nothing a user can do changes it. It is not a Python
# logger's: it reaches the terminal by the driver's forwarding of worker stderr, so it is dropped
# there. The worker's log file keeps it.
FORWARDED_NOISE = re.compile(
    r"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store and max_restarts > 0"
)


def filter_forwarded_worker_lines(pattern: re.Pattern = FORWARDED_NOISE) -> bool:
    """Wrap the driver's handler of forwarded worker output (``log_to_driver``) so that lines matching
    ``pattern`` are not printed. False when this Ray has no such handler (nothing changed)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    changed = False
    with dispatcher._lock:
        for i, (name, handle) in enumerate(dispatcher.handlers):
            if name != "ray_print_logs" or getattr(handle, "filters_noise", False):
                continue

            def filtered(data, handle=handle):
                lines = [line for line in data.get("lines", []) if not pattern.search(line)]
                if lines:
                    handle({**data, "lines": lines})

            filtered.filters_noise = True
            dispatcher.handlers[i] = (name, filtered)
            changed = True
    return changed


def quiet_driver_loggers() -> None:
    """The driver's side of a quiet terminal: its routine loggers raised to ``QUIET_DRIVER_LOGGERS``, and
    forwarded worker lines without colour codes off a terminal (``plain_worker_prefixes``)."""
    for name, level in QUIET_DRIVER_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    plain_worker_prefixes()


def plain_worker_prefixes() -> None:
    """Forwarded worker lines start with "(RayTrainWorker pid=...)" in ANSI colour; in a log file or a
    pipe the escape codes are noise ("\x1b[36m(...)\x1b[0m epoch 1/4 ..."), so they are turned off
    (``RAY_COLOR_PREFIX=0``, read by the driver at each print) unless both streams are terminals.
    An explicit setting wins."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def print_log_folder(ray, who: str) -> None:
    """Where the full logs are, since the terminal shows only warnings and errors."""
    try:
        folder = ray._private.worker.global_worker.node.get_logs_dir_path()  # no public API in 2.60
    except Exception:
        return
    print(f"{who}: Ray's logs are in {folder}", file=sys.stderr, flush=True)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray-address`` and ``--num-cpus``, spelled and explained alike in every entry point."""
    parser.add_argument("--ray-address", help=ADDRESS_HELP)
    parser.add_argument("--num-cpus", type=int, help=NUM_CPUS_HELP)


# Ray 2.60 turns the loopback address asked of it (``_node_ip_address="127.0.0.1"``, ``ray start
# --node-ip-address=127.0.0.1``) into the machine's own address unless this is set to 0 (its name is
# historical: on Linux it defaults to 1). With the node address 127.0.0.1, GCS, the raylet, the workers,
# the dashboard and runtime-env agents and the metrics exporter all bind 127.0.0.1 instead of all
# interfaces (tests/pipelines/test_ray_runtime.py checks it with ``ss``).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only(ray) -> None:
    """Make the Ray about to start embedded here bind the loopback interface only.

    The variable is read when ``ray`` is imported, which may have happened already (``from ray import
    serve``), so the constant it sets is set too. It is inherited by every process the embedded Ray
    starts. Never used when joining a cluster: a driver that joins one must advertise a reachable address.
    """
    os.environ[LOOPBACK_ENV] = "0"
    # Gloo (Ray Train's CPU process group) listens on the address the host name resolves to unless told
    # which interface to use; the workers of a local Ray meet on loopback.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


# A Ray session directory: <temp dir>/session_<date>_<time>_<microseconds>_<pid of the process that made it>.
SESSION_RE = re.compile(r"(/\S*?/session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+))(?=/|$|\s)")
CORE_PROCESSES = ("gcs_server", "raylet")


def _read(path: str, binary: bool = False):
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data if binary else data.decode(errors="replace")


def _ray_processes() -> dict[int, tuple[str, set[str]]]:
    """Processes of this user other than this one and its ancestors that name a Ray session directory in
    their command line or hold a file open inside one: pid -> (command line, session directories)."""
    ancestors, pid = set(), os.getpid()
    while pid > 1 and pid not in ancestors:
        ancestors.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        pid = int(stat.rsplit(")", 1)[1].split()[1]) if stat else 0
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ancestors:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            targets = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:  # gone, or not ours to look into
            continue
        cmdline = (_read(f"/proc/{entry}/cmdline", binary=True) or b"").replace(b"\0", b" ").decode(errors="replace")
        sessions = {m.group(1) for text in (cmdline, *targets) for m in SESSION_RE.finditer(text)}
        if sessions:
            found[int(entry)] = (cmdline.strip(), sessions)
    return found


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(")", 1)[1].split()[0] != "Z"


def leftover_ray_processes() -> dict[int, str]:
    """Processes of embedded Ray sessions whose driver is gone: pid -> command line.

    A session counts as gone only when the process that created it (its directory name ends with that
    pid) is not running and neither is any GCS server or raylet of it; an embedded Ray's GCS and raylet
    die with their driver, while a ``ray start`` cluster's outlive the ``ray start`` command and keep its
    session alive. Only processes that are Ray's own (``ray::...`` or a program of the installed Ray) and
    that belong to gone sessions alone are listed. After a driver is killed with SIGKILL, its dashboard
    and runtime-env agents otherwise linger for a minute or more.
    """
    if not sys.platform.startswith("linux"):
        return {}
    import ray

    ray_dir = os.path.dirname(ray.__file__) + os.sep
    processes = _ray_processes()
    live = set()
    for pid, (cmdline, sessions) in processes.items():
        if os.path.basename(cmdline.split(" ", 1)[0]) in CORE_PROCESSES:
            live |= sessions
    for pid, (cmdline, sessions) in processes.items():
        for session in sessions:
            if _alive(int(SESSION_RE.search(session + "/").group(2))):
                live.add(session)
    return {
        pid: cmdline
        for pid, (cmdline, sessions) in processes.items()
        if not sessions & live and (cmdline.startswith("ray::") or ray_dir in cmdline)
    }


def stop_leftover_ray(who: str, grace_s: float = 3.0) -> list[int]:
    """Stop what :func:`leftover_ray_processes` finds: SIGTERM, then SIGKILL after ``grace_s``."""
    leftovers = leftover_ray_processes()
    if not leftovers:
        return []
    names = sorted(
        {
            next(
                (os.path.basename(arg) for arg in cmdline.split(" ")[1:] if arg.endswith(".py")),
                os.path.basename(cmdline.split(" ", 1)[0]),
            )
            for cmdline in leftovers.values()
        }
    )
    print(
        f"{who}: stopping {len(leftovers)} Ray process(es) left by an earlier run that was killed: "
        f"{', '.join(names)} (pids {', '.join(map(str, sorted(leftovers)))})",
        file=sys.stderr,
        flush=True,
    )
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftovers:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in leftovers):
            time.sleep(0.1)
        if not any(_alive(pid) for pid in leftovers):
            break
    return sorted(leftovers)


def cluster_address(address: str | None) -> str | None:
    """The cluster ``start_ray(address)`` joins (``address``, else ``RAY_ADDRESS``), or None when it
    starts its own loopback-only local Ray (neither is set, or it is ``local``)."""
    address = address or os.environ.get("RAY_ADDRESS")
    return None if not address or address == "local" else address


def start_ray(address: str | None = None, num_cpus: int | None = None, who: str = "seeder"):
    import ray

    if ray.is_initialized():
        return ray
    address = cluster_address(address)
    if address is not None:
        quiet_driver_loggers()
        ray.init(address=address, log_to_driver=True, runtime_env=RUNTIME_ENV, logging_level=logging.WARNING)
        filter_forwarded_worker_lines()
        return ray
    loopback_only(ray)
    try:
        stop_leftover_ray(who)
    except Exception as exc:  # never let the clean-up of an earlier run stop this one
        print(f"{who}: could not look for Ray processes left by an earlier run ({exc})", file=sys.stderr, flush=True)
    # Ray gives its raylet a fixed time to register; on an overloaded machine that can fail once.
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            quiet_driver_loggers()
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=True,
                runtime_env=RUNTIME_ENV,
                logging_level=logging.WARNING,
            )
            filter_forwarded_worker_lines()
            print_log_folder(ray, who)
            return ray
        except Exception as exc:  # Ray raises a bare Exception for a startup timeout
            ray.shutdown()
            if "timed out" not in str(exc) or attempt == STARTUP_ATTEMPTS:
                raise RuntimeError(
                    f"{who}: a local Ray did not start ({exc}); the machine may be overloaded: retry, raise "
                    "RAY_raylet_start_wait_time_s, or pass the address of a running cluster"
                ) from exc
            print(f"{who}: Ray did not start ({exc}); retrying", file=sys.stderr, flush=True)


def worker_nodes(ray) -> int:
    """Alive nodes of the cluster that can run work (CPUs or GPUs to offer)."""
    return sum(
        1
        for node in ray.nodes()
        if node.get("Alive") and (node.get("Resources", {}).get("CPU", 0) > 0 or node.get("Resources", {}).get("GPU", 0) > 0)
    )


def check_tracking_reaches_workers(ray, uri: str) -> None:
    """Raise a ``DataError`` when runs on other nodes could not log to ``uri``: a ``sqlite:`` or file
    store is a path of this node, and a training worker or a sweep trial runs on any node of a
    cluster. One node (an embedded local Ray) may use it."""
    from seeder.system.io import DataError

    if uri.startswith(("http://", "https://", "databricks")) or worker_nodes(ray) <= 1:
        return
    raise DataError(
        f"MLflow store {uri} is a path of this node, and this cluster has {worker_nodes(ray)} nodes "
        "that run work: start `mlflow server --host 127.0.0.1 ...` on the head (see README, "
        "'Scaling out') and set MLFLOW_TRACKING_URI=http://HEAD:PORT for the job, or pass --no-mlflow"
    )
