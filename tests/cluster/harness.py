"""A real multi-node Ray cluster on one machine whose nodes share no disk, and an S3 server beside it.

Why: on a real cluster each node has its own disk, so any code path that writes a file on the driver
and reads it in a task (or the other way round) works on a laptop and breaks in production. Here every
worker node runs in its own mount namespace where the driver's directories are an empty private tmpfs,
so such a path fails in a test too, while TCP on 127.0.0.1 still reaches the head and the S3 server.

Layout (``root`` is a short directory under /tmp, because Ray's Unix socket paths under ``--temp-dir``
must stay under about 107 bytes):

    root/driver        the driver's local files: datasets, outputs, the head's SEEDER_CACHE (driver/cache)
    root/head          the head node: HOME, Ray's --temp-dir (head/ray)
    root/logs          what each ``ray start`` printed, one file per node (host-visible for every node)
    root/w-NAME        inside worker NAME's namespace only: its HOME, SEEDER_CACHE, TMPDIR and Ray temp dir

On a worker node, ``root`` and every other directory in ``hidden`` (by default pytest's base temp
directory, so every ``tmp_path`` too) is an empty tmpfs. The head runs in a mount namespace of its own
too, with no mounts in it: it sees what the host sees, and the namespace only lets the harness find,
and kill, exactly the processes of each node (Ray's workers, agents and job drivers included) without
touching any other Ray instance on the machine. ``ray stop`` is never used: it stops every Ray on the
machine.

Nothing here mounts in the host's namespace: a node's tmpfs lives and dies with its namespace, which
the kernel removes once the node's last process is gone and the harness has closed its handle on it.

A namespace is named by an inode number (``mnt:[4026532301]``), and the kernel reuses the number of a
freed namespace for the next one created, possibly by another test's cluster on the same machine. So
the harness holds an open descriptor on each node's namespace from its start until its processes are
gone (that pins the number to this node), and never looks a namespace up after closing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin: ray, python
RAY = str(BIN / "ray")

TERMINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
STARTUP_ATTEMPTS = 3
"""How many times a worker's ``ray start`` is tried when it times out waiting for the GCS."""
STARTUP_TIMEOUT = "timed out during startup"
"""What Ray's ``ray start`` prints when the GCS did not answer its node's registration in time."""


class NodeExited(RuntimeError):
    """A node's ``ray start`` exited before the node was alive; ``log_tail`` is what it printed last."""

    def __init__(self, message: str, log_tail: str):
        super().__init__(message)
        self.log_tail = log_tail


# --------------------------------------------------------------------------- preconditions


def cluster_unavailable_reason() -> str | None:
    """Why a namespaced cluster cannot run here, or None. Mount namespaces and tmpfs mounts need root
    (or CAP_SYS_ADMIN) and a kernel and sandbox that allow ``unshare``; reading other processes'
    namespaces needs /proc. Checked by running the real thing, ``unshare --mount true``."""
    if not sys.platform.startswith("linux"):
        return "needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "needs root: each worker node runs in its own mount namespace with a private tmpfs"
    for tool in ("unshare", "mount", "bash"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if not Path(RAY).exists():
        return f"no `ray` CLI next to {sys.executable}"
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`unshare --mount true` did not run: {exc}"
    if done.returncode != 0:
        return f"`unshare --mount true` is not permitted here: {done.stderr.strip() or done.returncode}"
    return None


def s3_unavailable_reason() -> str | None:
    """Why the S3 server cannot start, or None: it is moto's, from the ``moto[server]`` extra."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        return f"moto[server] is not installed ({exc})"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on now. All sockets are held
    open until every port is picked, so the ports differ from each other; another process may still
    take one before Ray binds it (a small, accepted race, as in the rest of the suite)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------- S3


@dataclass
class S3Bucket:
    """A bucket on a local S3-compatible server. ``env`` holds the credentials a client needs (pass it
    to a job's ``env``); ``uri(prefix)`` is the URI form the project reads with pyarrow."""

    bucket: str
    endpoint: str  # http://127.0.0.1:PORT
    env: dict[str, str]

    def uri(self, prefix: str = "") -> str:
        """``s3://bucket/prefix?endpoint_override=http://127.0.0.1:PORT&scheme=http``, as seeder/system/storage.py
        and ``pyarrow.fs.FileSystem.from_uri`` take it."""
        path = f"{self.bucket}/{prefix.strip('/')}".rstrip("/")
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http"

    def filesystem(self, allow_bucket_creation: bool = False):
        """A pyarrow S3FileSystem on this server, for the test process itself (credentials passed
        explicitly, so the test's own environment need not hold them)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.env["AWS_ACCESS_KEY_ID"],
            secret_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region=self.env["AWS_DEFAULT_REGION"],
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=allow_bucket_creation,
        )


@contextlib.contextmanager
def s3_server(bucket: str | None = None) -> Iterator[S3Bucket]:
    """Run moto's S3 server in a thread of this process on 127.0.0.1 (a free port) and create one
    bucket. Moto keeps its state per process, so the bucket name is random unless given: two servers
    in one pytest process would otherwise share buckets."""
    from moto.server import ThreadedMotoServer

    bucket = bucket or f"cluster-{secrets.token_hex(4)}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = S3Bucket(bucket, f"http://{host}:{port}", env)
        s3.filesystem(allow_bucket_creation=True).create_dir(bucket)
        yield s3
    finally:
        server.stop()


# --------------------------------------------------------------------------- processes by namespace


def mount_namespace(pid: int) -> str | None:
    """The mount namespace of ``pid`` (``mnt:[inode]``), or None once it is gone (zombies included)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_namespace(namespace: str) -> list[int]:
    """Every live process whose mount namespace is ``namespace``: exactly one node's processes. Never
    the host's namespace: refusing it keeps a bug here from killing unrelated processes."""
    if namespace == mount_namespace(os.getpid()):
        raise ValueError("refusing to list the host's mount namespace")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and mount_namespace(int(entry)) == namespace:
            found.append(int(entry))
    return found


def kill_namespace(namespace: str, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
    """Send ``sig`` to every process in ``namespace`` until none is left (SIGKILL) or ``timeout``.
    Processes are stopped (SIGSTOP) first so that a raylet cannot start new workers, and ``ray start
    --block`` cannot react, between the listing and the kill. The caller must hold the namespace open
    (``Node.ns_fd``) throughout: otherwise its number could pass to a namespace created meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_in_namespace(namespace)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes left in {namespace}: {_describe(pids)}")
        if sig == signal.SIGKILL:
            _signal_all(pids, signal.SIGSTOP)
        _signal_all(pids, sig)
        time.sleep(0.1)
        if sig != signal.SIGKILL:
            return


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _describe(pids: Iterable[int]) -> str:
    names = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        names.append(f"{pid} {cmd[:80]}")
    return "; ".join(names)


# --------------------------------------------------------------------------- the cluster


@dataclass
class Node:
    """One Ray node: the ``unshare ... ray start --block`` process, its mount namespace (held open by
    ``ns_fd`` until ``release``) and Ray node id.
    ``resource`` is the custom resource only this node has (``node_a`` for worker ``a``), which a task
    can ask for to run there: ``.options(resources={"node_a": 0.01})``."""

    name: str
    proc: subprocess.Popen
    namespace: str
    log: Path  # what ``ray start`` printed, readable from the host
    resource: str | None = None
    node_id: str | None = None
    private: Path | None = None  # the node's own directory (inside its namespace only), for workers
    ns_fd: int | None = None  # an open handle on the namespace: keeps its number from being reused
    start: tuple[str, Mapping[str, str]] | None = None  # (script, env) that started it, for a retry

    def pids(self) -> list[int]:
        """The node's live processes: raylet, agents, Ray workers, and for the head GCS, dashboard and
        job drivers. Empty once released: the namespace's number may belong to someone else by then."""
        if self.ns_fd is None:
            return []
        return pids_in_namespace(self.namespace)

    def kill(self) -> None:
        """SIGKILL every process of the node (see ``kill_namespace``), reap ``ray start``, and release
        the namespace. Only ever called while the handle is held, so it cannot hit another's processes."""
        if self.ns_fd is not None:
            kill_namespace(self.namespace, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.release()

    def release(self) -> None:
        """Close the handle on the namespace; with no process left in it, the kernel frees it and its
        tmpfs."""
        if self.ns_fd is not None:
            os.close(self.ns_fd)
            self.ns_fd = None

    def path(self, inside: str | os.PathLike) -> Path:
        """The host's view of a path as this node sees it (``/proc/PID/root``), while a process of it
        lives: to read a worker node's private files, such as its Ray logs, from the test. An absolute
        symlink in there (Ray's ``session_latest``) resolves in the host's view, not the node's."""
        for pid in self.pids():
            root = Path(f"/proc/{pid}/root")
            if root.exists():
                return root / str(inside).lstrip("/")
        raise FileNotFoundError(f"node {self.name} has no live process")


@dataclass
class JobResult:
    """A finished (or abandoned) Ray job: its status (SUCCEEDED, FAILED, STOPPED, or the last state
    seen before a timeout), the driver's log and Ray's message."""

    submission_id: str
    status: str
    logs: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"

    def lines_with(self, prefix: str) -> list[str]:
        """The log lines that start with ``prefix``, without it: the way a job script hands values back
        (print ``RESULT {json}``, read ``lines_with("RESULT ")``)."""
        return [line[len(prefix) :] for line in self.logs.splitlines() if line.startswith(prefix)]


@dataclass
class Cluster:
    """A head with no CPUs and worker nodes in private mount namespaces; see the module's docstring.
    Build it with ``start_cluster``; its methods start and kill workers and submit jobs."""

    root: Path
    hidden: list[Path]
    env: dict[str, str]  # what every node and every Ray CLI call gets: token, PATH, Ray settings
    gcs_port: int
    dashboard_port: int
    object_store_memory: int
    head: Node | None = None
    workers: dict[str, Node] = field(default_factory=dict)
    dead: list[Node] = field(default_factory=list)  # killed workers, kept for debug_report
    keep_root: bool = False  # set (by a fixture, on failure) to leave ``root`` on disk after shutdown

    # -- addresses ------------------------------------------------------------

    @property
    def address(self) -> str:
        """The GCS address that ``ray start --address`` and ``ray.init(address=...)`` take."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        """The dashboard's URL: ``ray job submit --address`` and the REST APIs."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def driver_dir(self) -> Path:
        """Where the test and the job's driver keep local files; empty on every worker node."""
        return self.root / "driver"

    @property
    def token(self) -> str:
        return self.env["RAY_AUTH_TOKEN"]

    # -- nodes ----------------------------------------------------------------

    def _ports(self) -> list[str]:
        """Explicit free ports for every server a node starts: Ray's defaults (52365 for the agent,
        10001 for the client server, 10002-19999 for workers) collide between nodes on one machine and
        with any other Ray running here. Workers' ports are left to the kernel (0)."""
        names = [
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        ]
        return [f"{name}={port}" for name, port in zip(names, free_ports(len(names)))] + [
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]

    def _spawn(self, name: str, script: str, env: Mapping[str, str]) -> Node:
        """Run ``script`` under bash in a new mount namespace (private propagation: nothing mounted
        in it reaches the host) and wait until it is in the new namespace. ``script`` ends by exec'ing
        ``ray start --block``, so the Popen's pid is that process throughout."""
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        host = mount_namespace(os.getpid())
        deadline = time.monotonic() + 20
        while True:
            namespace = mount_namespace(proc.pid)
            if namespace is not None and namespace != host:
                with contextlib.suppress(OSError):
                    fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                    if f"mnt:[{os.fstat(fd).st_ino}]" == namespace and proc.poll() is None:
                        return Node(name, proc, namespace, log, ns_fd=fd)
                    os.close(fd)
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"node {name} did not enter its namespace:\n{_tail(log)}")
            time.sleep(0.02)

    def start_head(self, health_check_period_ms: int = 1000, health_check_failure_threshold: int = 5) -> Node:
        """Start the head: no CPUs (every task and actor runs on a worker node), dashboard and agents on
        127.0.0.1, token auth, its own HOME and temp dir. The GCS pings each raylet every
        ``health_check_period_ms`` and declares it dead after ``health_check_failure_threshold`` misses:
        about 5 s after a hard kill here instead of Ray's default of about 15 to 30 s."""
        home = self.root / "head" / "home"
        home.mkdir(parents=True, exist_ok=True)
        (self.driver_dir / "cache").mkdir(parents=True, exist_ok=True)
        env = dict(
            self.env,
            HOME=str(home),
            SEEDER_CACHE=str(self.driver_dir / "cache"),
            RAY_health_check_period_ms=str(health_check_period_ms),
            RAY_health_check_timeout_ms=str(max(health_check_period_ms, 1000)),
            RAY_health_check_failure_threshold=str(health_check_failure_threshold),
        )
        (client_port,) = free_ports(1)
        args = [
            RAY,
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs_port}",
            "--num-cpus=0",
            "--num-gpus=0",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={client_port}",
            f"--object-store-memory={self.object_store_memory}",
            f"--temp-dir={self.root / 'head' / 'ray'}",
            "--disable-usage-stats",
            *self._ports(),
        ]
        self.head = self._spawn("head", "exec " + shlex.join(args), env)
        self.head.node_id = self._wait_for_node(self.head, lambda n: n.get("is_head_node"), timeout=90)
        return self.head

    def add_worker(
        self,
        name: str,
        num_cpus: int = 1,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 90,
    ) -> Node:
        """Start worker node ``name`` (a fresh one if a node of that name was killed before) in its own
        mount namespace, where every directory in ``hidden`` is an empty tmpfs and its HOME,
        SEEDER_CACHE, TMPDIR and Ray temp dir are under ``root/w-NAME`` on that tmpfs. It gets the custom
        resource ``node_NAME`` (1 unit) besides ``resources``. With ``wait``, returns once the GCS lists
        it alive, with its node id set. ``env`` adds to the node's environment (its raylet's, so every
        Ray worker process on it inherits it)."""
        if name in self.workers:
            raise ValueError(f"worker {name} is running; kill_worker it first")
        private = self.root / f"w-{name}"
        resource = f"node_{name}"
        node_env = dict(
            self.env, HOME=str(private / "home"), SEEDER_CACHE=str(private / "cache"), TMPDIR=str(private / "tmp"), **(env or {})
        )
        args = [
            RAY,
            "start",
            f"--address={self.address}",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--resources={json.dumps({resource: 1, **(resources or {})})}",
            f"--object-store-memory={self.object_store_memory}",
            f"--temp-dir={private / 'ray'}",
            "--disable-usage-stats",
            *self._ports(),
        ]
        mounts = "\n".join(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(d))}" for d in self.hidden)
        script = (
            f"set -e\n{mounts}\nmkdir -p {shlex.quote(str(private))}/home {shlex.quote(str(private))}/cache "
            f"{shlex.quote(str(private))}/tmp\nexec {shlex.join(args)}\n"
        )
        known = {n.node_id for n in self.dead}
        node = self._spawn(name, script, node_env)
        node.resource, node.private, node.start = resource, private, (script, node_env)
        self.workers[name] = node
        if wait:
            self.wait_for_worker(name, timeout=timeout, exclude=known)
        return node

    def wait_for_worker(self, name: str, timeout: float = 90, exclude: Iterable[str] = ()) -> str:
        """Wait until worker ``name`` is alive in the GCS and return (and record) its node id. Ids in
        ``exclude`` (a killed node of the same name) do not count.

        A ``ray start`` that gives up because the GCS did not answer in time (Ray's "timed out during
        startup": seen when the whole test suite loads the two cores) is started again, up to
        ``STARTUP_ATTEMPTS`` times in all; any other exit fails at once."""
        exclude = set(exclude) | {n.node_id for n in self.dead}
        for attempt in range(1, STARTUP_ATTEMPTS + 1):
            node = self.workers[name]
            try:
                node.node_id = self._wait_for_node(
                    node,
                    lambda n: node.resource in (n.get("resources_total") or {}) and n["node_id"] not in exclude,
                    timeout=timeout,
                )
                return node.node_id
            except NodeExited as exited:
                if attempt == STARTUP_ATTEMPTS or STARTUP_TIMEOUT not in exited.log_tail:
                    raise
            # The raylet of the failed start may have registered meanwhile: kill it and let the GCS
            # declare it dead, so that only the new start's node can match.
            node.kill()
            self._wait_until_none_alive(node.resource, timeout=30)
            with contextlib.suppress(OSError):
                with open(node.log, "a") as log:
                    log.write(f"\n--- harness: ray start timed out (attempt {attempt}); starting node {name} again ---\n")
            script, env = node.start
            again = self._spawn(name, script, env)
            again.resource, again.private, again.start = node.resource, node.private, node.start
            self.workers[name] = again
        raise AssertionError("unreachable")

    def _wait_until_none_alive(self, resource: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if not any(e.get("state") == "ALIVE" and resource in (e.get("resources_total") or {}) for e in self.nodes()):
                    return
            time.sleep(0.5)

    def _wait_for_node(self, node: Node, match, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            if node.proc.poll() is not None:
                tail = _tail(node.log)
                raise NodeExited(f"node {node.name} exited with {node.proc.returncode}:\n{tail}", tail)
            with contextlib.suppress(OSError, ValueError):
                for entry in self.nodes():
                    if entry.get("state") == "ALIVE" and match(entry):
                        return entry["node_id"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.name} not alive after {timeout} s:\n{_tail(node.log)}")
            time.sleep(0.5)

    def kill_worker(self, name: str) -> Node:
        """Kill worker node ``name`` hard, as a machine that loses power: SIGKILL to every process in its
        namespace (raylet, agents, Ray workers), no chance to tell the GCS. Its tmpfs goes with the
        namespace. Returns the dead node; ``add_worker(name)`` starts a replacement."""
        node = self.workers.pop(name)
        node.kill()
        self.dead.append(node)
        return node

    def node_state(self, node_id: str) -> str | None:
        """ALIVE or DEAD as the GCS sees node ``node_id`` now; None if it does not list it."""
        for entry in self.nodes():
            if entry["node_id"] == node_id:
                return entry.get("state")
        return None

    def wait_for_node_state(self, node_id: str, state: str = "DEAD", timeout: float = 30) -> float:
        """Wait until the GCS reports node ``node_id`` in ``state``; return the seconds it took."""
        start = time.monotonic()
        while True:
            with contextlib.suppress(OSError, ValueError):
                if self.node_state(node_id) == state:
                    return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"node {node_id} not {state} after {timeout} s: {self.nodes()}")
            time.sleep(0.25)

    # -- REST -----------------------------------------------------------------

    def _request(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 30):
        """A JSON request to the dashboard with the cluster's token, from this process: no Ray import
        and no ``ray.init`` in the test process, so the test itself never becomes a driver."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.dashboard + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode())

    def request(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 30):
        """Any dashboard REST call, authenticated: ``request("/api/v0/actors?detail=true")`` for the
        state API (actors, tasks, placement groups), ``/api/jobs/...`` for jobs. Returns parsed JSON."""
        return self._request(path, method=method, body=body, timeout=timeout)

    def nodes(self) -> list[dict]:
        """Every node the GCS knows, dead ones included, from the state API (what ``ray list nodes``
        shows): dicts with node_id, state (ALIVE/DEAD), is_head_node, resources_total, ..."""
        reply = self._request("/api/v0/nodes?limit=1000&detail=true&timeout=20")
        return reply["data"]["result"]["result"]

    # -- jobs -----------------------------------------------------------------

    def submit_job(
        self,
        entrypoint: str | list[str],
        working_dir: str | os.PathLike = REPO,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 300,
        submission_id: str | None = None,
        runtime_env: Mapping | None = None,
    ) -> JobResult:
        """Submit a job with ``ray job submit --no-wait`` (the path a user takes); with ``wait``, wait for
        it (``wait_job``) and return its status and logs, else return at once with status PENDING.

        ``working_dir`` is uploaded by Ray to every node that runs the job's code (the repository by
        default; it must stay small, and .gitignore'd files are skipped). ``env`` becomes the runtime
        env's ``env_vars``: it reaches the driver and every Ray worker of the job on every node, and
        overrides a node's own values (so leave SEEDER_CACHE and HOME out of it unless that is the
        point). ``runtime_env`` adds other runtime env fields. A list entrypoint is shell-quoted;
        ``python`` is the virtualenv's on every node."""
        if not isinstance(entrypoint, str):
            entrypoint = shlex.join(entrypoint)
        submission_id = submission_id or f"job-{secrets.token_hex(6)}"
        spec = dict(runtime_env or {})
        if env:
            spec["env_vars"] = {**spec.get("env_vars", {}), **env}
        args = [
            RAY,
            "job",
            "submit",
            f"--address={self.dashboard}",
            f"--working-dir={working_dir}",
            f"--submission-id={submission_id}",
            "--no-wait",
        ]
        if spec:
            args.append(f"--runtime-env-json={json.dumps(spec)}")
        done = subprocess.run(
            [*args, "--", *shlex.split(entrypoint)],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=str(self.driver_dir),
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray job submit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        if not wait:
            return JobResult(submission_id, "PENDING", "")
        return self.wait_job(submission_id, timeout=timeout)

    def job_info(self, submission_id: str) -> dict:
        """The job's record from the Jobs REST API: status, message, start and end times, entrypoint."""
        return self._request(f"/api/jobs/{submission_id}")

    def job_logs(self, submission_id: str) -> str:
        """Everything the job's driver printed so far (Ray forwards its tasks' and actors' output there)."""
        return self._request(f"/api/jobs/{submission_id}/logs").get("logs", "")

    def stop_job(self, submission_id: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._request(f"/api/jobs/{submission_id}/stop", method="POST")

    def wait_job(self, submission_id: str, timeout: float = 300) -> JobResult:
        """Poll the job until it ends or ``timeout`` passes; on timeout the job is stopped and the result
        carries the last status seen (not SUCCEEDED, so ``.ok`` is False) and the logs so far."""
        deadline = time.monotonic() + timeout
        info: dict = {}
        while True:
            with contextlib.suppress(OSError, ValueError):
                info = self.job_info(submission_id)
            if info.get("status") in TERMINAL_JOB_STATES:
                break
            if time.monotonic() > deadline:
                self.stop_job(submission_id)
                return JobResult(
                    submission_id,
                    f"TIMEOUT({info.get('status')})",
                    self.job_logs(submission_id),
                    f"did not finish in {timeout} s",
                )
            time.sleep(0.5)
        return JobResult(submission_id, info["status"], self.job_logs(submission_id), info.get("message") or "")

    # -- teardown and diagnostics -----------------------------------------------

    def all_nodes(self) -> list[Node]:
        return ([self.head] if self.head else []) + list(self.workers.values()) + self.dead

    def shutdown(self, grace: float = 1) -> None:
        """Stop every node this cluster started and nothing else: SIGTERM to every process in each node's
        namespace (workers first, so they do not outlive the GCS and retry it), SIGKILL after ``grace``
        seconds (the dashboard's and agents' Python processes exit on SIGTERM within a second; gcs_server,
        the raylets and ``ray start --block`` outlast any short grace, and nothing of theirs is kept), then
        check that no process is left in any of them and no tmpfs of theirs is mounted
        in the host's namespace. Raises AssertionError if either is not so."""
        live = list(self.workers.values()) + ([self.head] if self.head else [])
        for node in live:
            with contextlib.suppress(ValueError):
                _signal_all(node.pids(), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(node.pids() for node in live):
            time.sleep(0.2)
        left = {}
        for node in live:
            try:
                kill_namespace(node.namespace, signal.SIGKILL)
            except TimeoutError as exc:
                left[node.name] = str(exc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
            if node.pids():
                left.setdefault(node.name, _describe(node.pids()))
            node.release()
        assert not left, f"processes left after shutdown: {left}"
        mounted = [
            line
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if any(f" {d}" in line for d in [self.root, *self.hidden]) and line.startswith("tmpfs")
        ]
        assert not mounted, f"tmpfs mounts in the host namespace: {mounted}"

    def debug_report(self, lines: int = 40) -> str:
        """The tails of each node's ``ray start`` output and of its raylet, GCS and job logs (a worker
        node's are read through a live process of its namespace): what to print when a test fails."""
        parts = []
        for node in self.all_nodes():
            parts.append(f"===== node {node.name} ({node.node_id}) ray start output\n{_tail(node.log, lines)}")
            base = self.root / "head" / "ray" if node is self.head else node.private / "ray"
            try:  # not session_latest: it is an absolute link, which /proc/PID/root does not follow
                logs = sorted(node.path(base).glob("session_2*"))[-1] / "logs"
            except (FileNotFoundError, IndexError):
                continue
            for pattern in ("raylet.out", "gcs_server.out", "job-driver-*.log", "runtime_env_agent.log"):
                for path in sorted(logs.glob(pattern))[-3:]:
                    parts.append(f"===== node {node.name}: {path.name}\n{_tail(path, lines)}")
        return "\n".join(parts)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every node and CLI call: the caller's, minus its own Ray settings (a stray
    RAY_ADDRESS or token path would point at another cluster), plus a fresh token with token auth on,
    the virtualenv's bin first on PATH (``python`` in an entrypoint is the project's), and quiet
    telemetry. GLOO_SOCKET_IFNAME=lo keeps torch's gloo on loopback. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is
    left unset on purpose: it defaults to true on Linux, and set to 0 it makes ``ray start --address``
    refuse to join ("Multi-node Ray clusters are not supported on Windows and OSX")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        GLOO_SOCKET_IFNAME="lo",
        HF_HUB_OFFLINE="1",
        MLFLOW_DISABLE_TELEMETRY="true",
        PYTHONUNBUFFERED="1",
        PATH=os.pathsep.join([str(BIN), env.get("PATH", os.defpath)]),
    )
    env.update(extra or {})
    return env


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths not inside another of them: mounting on an outer one already hides the inner ones
    (and the inner path would not exist in the namespace to mount on)."""
    paths = sorted({Path(p).resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in paths:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


@contextlib.contextmanager
def start_cluster(
    workers: Iterable[str] = ("a", "b"),
    hidden: Iterable[str | os.PathLike] = (),
    env: Mapping[str, str] | None = None,
    object_store_memory: int = 512 * 1024**2,
    keep_root: bool = False,
) -> Iterator[Cluster]:
    """Start a head and one 1-CPU worker node per name in ``workers`` (started together, so both join in
    the time of one), yield the Cluster, and shut everything down on exit, removing ``root`` unless
    ``keep_root``. ``hidden`` adds directories that worker nodes must not see, besides ``root`` (the
    fixture adds pytest's base temp dir). ``env`` adds to every node's environment."""
    root = Path(tempfile.mkdtemp(prefix="rayc-", dir="/tmp" if Path("/tmp").is_dir() else None))
    gcs_port, dashboard_port = free_ports(2)
    cluster = Cluster(
        root=root,
        hidden=_outermost([root, *map(Path, hidden)]),
        env=base_env(env),
        gcs_port=gcs_port,
        dashboard_port=dashboard_port,
        object_store_memory=object_store_memory,
    )
    try:
        cluster.driver_dir.mkdir(parents=True)
        cluster.start_head()
        for name in workers:
            cluster.add_worker(name, wait=False)
        for name in list(cluster.workers):
            cluster.wait_for_worker(name)
        yield cluster
    finally:
        try:
            cluster.shutdown()
        finally:
            if not (keep_root or cluster.keep_root):
                shutil.rmtree(root, ignore_errors=True)
