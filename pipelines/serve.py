"""Online retrieval on Ray Serve: a trained SeedER model behind HTTP.

    python pipelines/serve.py --model M [--port 8000] [--replicas N] [--max-batch-size B]
    seeder serve --model M ...                      (the same command)

POST a JSON body ``{"questions": ["...", ...], "k": 10}`` (or ``{"question": "..."}``) to
``http://127.0.0.1:PORT/``, or GET ``/?question=...&k=10`` (one ``question`` parameter per question).
The reply is ``{"results": [{"question", "set_size", "nodes": [{"rank", "id", "name", "type", "score",
"step"}], "triples": [[head, relation, tail], ...]}, ...]}``. Each replica loads the model once
(``seeder.serving.retriever.Retriever``) and ranks the questions of concurrent requests together
(``serve.batch``), in one batched pass. A malformed body gets a 400 with the reason, a batch over
``--max-questions`` a 413; the service keeps running. It binds to 127.0.0.1 unless ``--host`` says
otherwise, and joins a cluster with ``--ray-address`` (e.g. the one ``cluster/gpu.yaml`` brings up,
with ``--device cuda``).

One replica on the embedded Ray (the default) answers HTTP on PORT itself (``answer_on_the_replica``).
Several replicas, a cluster or ``--through-proxy`` put Ray Serve's HTTP proxy on PORT; there a GET is
the cheaper form of a single question, as it carries no body for the replica to fetch back from the
proxy in a second call (2-3 ms here).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from seeder.system.io import DataError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# Ray Serve's throughput-optimised request path, read when Serve is imported in each of its processes
# (so set before the local Ray starts; on a cluster, in the environment of `ray start`): the request
# runs on the replica's event loop and the router on the caller's, not one thread hop each way.
# Single-question p50 over loopback fell from 28.1 to 25.4 ms and 50 clients went from 37 to 74
# questions/s on 2 cores. Its direct ingress (replicas answering HTTP on ports of their own) is off
# here; `main` turns it on for the one replica of the embedded Ray (`answer_on_the_replica`).
os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0")

APP_NAME = "seeder"
BOARD = "seeder-serve-versions"
"""The named Ray actor (``VersionBoard``) through which the admin route tells every replica which
artifacts to answer from, and each replica says which it answers from."""
BOARD_NAMESPACE = "seeder"
WATCH_S = 0.25
"""How often a replica looks at the board for a new artifacts location."""
SWITCH_TIMEOUT_S = 600.0
"""How long the admin route waits for every replica to answer from the new artifacts."""


class BadRequest(ValueError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, max_questions: int, max_k: int) -> tuple[list[str], int]:
    """The questions and k of a POST body; ``BadRequest`` (400/413) says what is wrong."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from exc
    if not isinstance(data, dict):
        raise BadRequest(400, 'send a JSON object: {"questions": ["..."], "k": 10}')
    questions = data.get("questions", [data["question"]] if "question" in data else None)
    if not isinstance(questions, list) or not questions:
        raise BadRequest(400, '"questions" must be a non-empty list of strings (or send "question": "...")')
    return checked(questions, data.get("k", 10), max_questions, max_k)


def parse_filters(data) -> dict[str, Any]:
    """The optional filters of a request (``Retriever.retrieve``'s ``types`` and ``where``): from a POST
    body's ``"types": [...]`` and ``"where": {"column": value or [values]}``, or a GET's ``type=`` params."""
    if hasattr(data, "getlist"):
        return {"types": data.getlist("type")} if data.getlist("type") else {}
    if not isinstance(data, dict):
        return {}
    filters = {}
    types, where = data.get("types"), data.get("where")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise BadRequest(400, '"types" must be a list of node type names')
        filters["types"] = types
    if where is not None:
        scalar = (str, int, float, bool)
        if not isinstance(where, dict) or not all(
            isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar) for x in v)) for v in where.values()
        ):
            raise BadRequest(400, '"where" must map node columns to a value or a list of values')
        filters["where"] = where
    return filters


def parse_query(params, max_questions: int, max_k: int) -> tuple[list[str], int]:
    """The questions and k of a GET's query string (``params``: a Starlette ``QueryParams`` or anything
    with ``getlist`` and ``get``): ``?question=...&question=...&k=10``."""
    questions = params.getlist("question")
    if not questions:
        raise BadRequest(400, 'GET /?question=...&k=10 (one "question" per question), or POST {"questions": ["..."], "k": 10}')
    k = params.get("k", "10")
    try:
        k = int(k)
    except ValueError:
        raise BadRequest(400, f'"k" must be an integer from 1 to {max_k}, not {k!r}') from None
    return checked(questions, k, max_questions, max_k)


def checked(questions: list, k, max_questions: int, max_k: int) -> tuple[list[str], int]:
    """``questions`` and ``k`` of either form, or ``BadRequest`` naming the first thing wrong."""
    if len(questions) > max_questions:
        raise BadRequest(413, f"{len(questions)} questions in one request; at most {max_questions} (split the batch)")
    bad = [i for i, q in enumerate(questions) if not isinstance(q, str) or not q.strip()]
    if bad:
        raise BadRequest(400, f"question {bad[0]} is not a non-empty string")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_k:
        raise BadRequest(400, f'"k" must be an integer from 1 to {max_k}')
    return questions, k


def bind_replica_grpc_to_loopback() -> None:
    """Ray 2.60's Serve replica opens its gRPC server (the proxy's path to it on the throughput-optimised
    request path, and other deployments') on ``[::]:0``, every interface, whatever the node's address
    (``ray/serve/_private/replica.py``, ``_on_initialized``). On the loopback-only Ray that ``seeder serve``
    embeds, the proxy and the replicas share this machine, so 127.0.0.1 is all they need. Called in the
    replica, before Serve opens the server; a Ray without that helper is left as it is."""
    from ray.serve._private import replica

    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "loopback_only", False):
        return

    def on_loopback(server, address: str):
        return original(server, "127.0.0.1" + address[len("[::]") :] if address.startswith("[::]:") else address)

    on_loopback.loopback_only = True
    replica.add_port_to_grpc_server = on_loopback


def answer_on_the_replica(host: str, port: int) -> int:
    """Have the one replica answer HTTP on ``host:port`` itself (Ray Serve's direct ingress); returns a
    free port on ``host`` for Serve's proxy, which Serve still starts. Serve's processes read these
    settings when they import Serve, so this runs before the embedded Ray starts, and they inherit them.

    Through the proxy, a request is parsed there and handed to the replica in a call, and the replica
    fetches a POST's body back from the proxy in a second call. Answered by the replica, a single
    question's POST takes about two thirds of its time through the proxy on 2 cores (benchmarks/RESULTS.md,
    "Smaller decisions"). Direct ingress gives each replica a port from a range: [port, port + 1)
    holds ``port`` alone, so this is for one replica."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as the replica's server binds: closed connections do not count
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port") from None
    with socket.socket() as probe:
        probe.bind((host, 0))
        proxy_port = probe.getsockname()[1]
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
    os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + 1)
    # Both delays are for a load balancer in front of the replicas (HAProxy), and there is none here: a
    # stopping replica waits 30 s for it to deregister, and a freed port is held back
    # from a restarted replica for minutes.
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "0"
    os.environ["RAY_SERVE_PORT_QUARANTINE_S"] = "0"
    return proxy_port


class VersionBoard:
    """Which artifacts the service should answer from (``target``) and which each replica answers from
    (``current``: replica id -> (artifacts, dataset version, error or None)). A Ray actor, named ``BOARD``:
    the driver's admin route writes the target, the replicas read it and report."""

    def __init__(self, artifacts: str | None):
        self._target = artifacts
        self._current: dict[str, tuple[str | None, str, str | None]] = {}

    def target(self) -> str | None:
        return self._target

    def set_target(self, artifacts: str) -> None:
        self._target = artifacts

    def report(self, replica: str, artifacts: str | None, version: str, error: str | None = None) -> None:
        self._current[replica] = (artifacts, version, error)

    def current(self) -> dict[str, tuple[str | None, str, str | None]]:
        return dict(self._current)


def build_app(
    model: str,
    artifacts: str | None,
    device: str,
    replicas: int,
    max_batch_size: int,
    batch_wait_ms: float,
    max_questions: int,
    cpus_per_replica: float,
    gpus_per_replica: float,
    encoder_precision: str = "artifacts",
    compiled: bool = False,
    loopback_only: bool = False,
):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=max(64, 2 * max_batch_size),
    )
    class SeederRetriever:
        def __init__(self):
            import threadpoolctl
            import torch

            from seeder.serving.retriever import Retriever

            if loopback_only:
                bind_replica_grpc_to_loopback()
            torch.set_num_threads(max(1, int(cpus_per_replica)))  # Ray sets OMP_NUM_THREADS=1 in actors
            # numpy's products here are small, and OpenBLAS's idle workers busy-wait on the cores that
            # the proxy and the batch's torch threads need: on 2 cores one BLAS thread took 50 clients from
            # 86 to 115 questions/s and 64-question requests from 236 to 261.
            threadpoolctl.threadpool_limits(1, user_api="blas")
            self.retriever = Retriever.load(
                model, artifacts=artifacts, device=device, encoder_precision=encoder_precision, compiled=compiled
            )
            self.max_k = self.retriever.ranking_length
            self.retriever.warm_up()  # encoder, name and graph indexes, compiled graphs: all before traffic
            self.location = artifacts

        async def reconfigure(self, _config: dict) -> None:
            # Serve calls this once the replica is up, on its event loop: the watch of the board runs there.
            import asyncio

            import ray

            self.board = ray.get_actor(BOARD, namespace=BOARD_NAMESPACE)
            self.replica_id = ray.get_runtime_context().get_actor_id()
            await self.board.report.remote(self.replica_id, self.location, self.retriever.dataset_version)
            self.watch = asyncio.get_running_loop().create_task(self.watch_board())

        async def watch_board(self) -> None:
            """Switch to the board's target artifacts when it changes: the new retriever is built and
            warmed in a thread while this one keeps answering; a request holds the retriever it started
            with, so requests in flight finish on the old version and none waits for the switch."""
            import asyncio

            while True:
                target = await self.board.target.remote()
                if target != self.location:
                    try:
                        new = await asyncio.to_thread(self.switched, target)
                    except Exception as exc:  # the old version keeps answering; the admin route reports it
                        await self.board.report.remote(self.replica_id, target, "", f"{type(exc).__name__}: {exc}")
                        self.location = target
                    else:
                        self.retriever, self.location = new, target
                        await self.board.report.remote(self.replica_id, target, new.dataset_version)
                await asyncio.sleep(WATCH_S)

        def switched(self, target: str):
            new = self.retriever.reload(target)
            new.warm_up()
            return new

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_ms / 1000)
        async def rank(self, requests: list[tuple[list[str], int]]) -> list[list[dict[str, Any]]]:
            # One batched pass over the questions of every request that arrived together, each with its k
            # (so a request's triples are those among its own top k).
            flat = [q for questions, _ in requests for q in questions]
            retriever = self.retriever  # one version for the whole batch, even if a switch lands meanwhile
            hits = retriever.retrieve(flat, k=[k for questions, k in requests for _ in questions])
            out, start = [], 0
            for questions, _ in requests:
                out.append([h.to_dict() for h in hits[start : start + len(questions)]])
                start += len(questions)
            return out

        async def __call__(self, request: Request):
            if request.method not in ("POST", "GET"):
                return JSONResponse(
                    {"error": 'POST a JSON body {"questions": ["..."], "k": 10} or GET /?question=...&k=10'}, status_code=405
                )
            try:
                if request.method == "GET":
                    questions, k = parse_query(request.query_params, max_questions, self.max_k)
                    filters = parse_filters(request.query_params)
                else:
                    body = await request.body()
                    questions, k = parse_request(body, max_questions, self.max_k)
                    filters = parse_filters(json.loads(body))
            except BadRequest as exc:
                return JSONResponse({"error": str(exc)}, status_code=exc.status)
            if filters or len(questions) > max_batch_size:  # a large or filtered request is ranked on its own
                try:
                    hits = self.retriever.retrieve(questions, k=k, **filters)
                except DataError as exc:  # a filter that names an unknown column or matches no node
                    return JSONResponse({"error": str(exc)}, status_code=400)
                return JSONResponse({"results": [h.to_dict() for h in hits]})
            return JSONResponse({"results": await self.rank((questions, k))})

    return SeederRetriever.options(user_config={}).bind()  # a user_config, so that Serve calls reconfigure


def start_admin(port: int, board, info, model: str, replicas: int):
    """The admin route, on 127.0.0.1 only, in a thread of the driver: ``POST /reload`` with
    ``{"artifacts": LOCATION}`` checks that the model can run on those artifacts (``check_compatible``:
    an update of its graph or another graph in its feature space), puts them on the board and answers
    once every replica answers from them: 200 with the dataset version, 400 when the model cannot run
    on them, 500 with a replica's error (that replica keeps the old version). ``GET /versions`` shows the
    board."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import ray

    from seeder.preprocessing.artifacts import open_artifacts
    from seeder.serving.retriever import check_compatible

    switching = threading.Lock()  # one switch at a time

    class Admin(BaseHTTPRequestHandler):
        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path != "/versions":
                return self.reply(404, {"error": "GET /versions or POST /reload"})
            board_target, current = ray.get([board.target.remote(), board.current.remote()])
            self.reply(200, {"target": board_target, "replicas": {r: list(v) for r, v in current.items()}})

        def do_POST(self):
            if self.path != "/reload":
                return self.reply(404, {"error": "GET /versions or POST /reload"})
            try:
                data = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                location = data["artifacts"]
                if not isinstance(location, str) or not location:
                    raise KeyError
            except (ValueError, KeyError, TypeError):
                return self.reply(400, {"error": 'POST /reload with a JSON body {"artifacts": "LOCATION"}'})
            with switching:
                try:
                    check_compatible(info, open_artifacts(location), model)
                except DataError as exc:
                    return self.reply(400, {"error": str(exc)})
                ray.get(board.set_target.remote(location))
                deadline = time.monotonic() + SWITCH_TIMEOUT_S
                while time.monotonic() < deadline:
                    reports = [v for v in ray.get(board.current.remote()).values() if v[0] == location]
                    failed = [v[2] for v in reports if v[2]]
                    if failed:
                        return self.reply(500, {"error": f"a replica could not switch: {failed[0]}; it answers as before"})
                    if len(reports) >= replicas:
                        return self.reply(200, {"artifacts": location, "dataset": reports[0][1], "replicas": len(reports)})
                    time.sleep(WATCH_S)
                self.reply(504, {"error": f"the replicas did not switch within {SWITCH_TIMEOUT_S:.0f} s"})

        def log_message(self, *args) -> None:  # no access log on the terminal
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Admin)
    threading.Thread(target=server.serve_forever, name="seeder-serve-admin", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    from seeder.cli.arguments import add_compile_argument, add_encoder_precision_argument

    parser = argparse.ArgumentParser(
        prog="seeder serve",
        description="Serve a trained SeedER model over HTTP on Ray Serve.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="model directory (RUN/model), runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts to search (default: the ones the model was trained on)")
    parser.add_argument("--host", default="127.0.0.1", help="address the service binds to (loopback unless told otherwise)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument(
        "--proxy-location",
        choices=["EveryNode", "HeadOnly"],
        default="EveryNode",
        help="on a cluster, where Ray Serve's HTTP proxies run: on every node that holds a replica "
        "(behind a load balancer), or on the head alone (one address to call)",
    )
    parser.add_argument(
        "--through-proxy",
        action="store_true",
        help="answer through Ray Serve's HTTP proxy even with one replica on the embedded Ray (with several "
        "replicas or a cluster it always does); by default that replica answers HTTP itself",
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas of the model")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs per replica (also its torch threads)")
    parser.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs per replica (use with --device cuda)")
    parser.add_argument("--device", default="cpu", help="torch device of each replica")
    parser.add_argument("--max-batch-size", type=int, default=64, help="questions of concurrent requests ranked together")
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="how long a replica waits to fill a batch; at 0 it ranks what has arrived, and requests "
        "that arrive meanwhile form the next batch (a lone request does not wait)",
    )
    parser.add_argument("--max-questions", type=int, default=2048, help="questions allowed in one request (more: 413)")
    parser.add_argument(
        "--ray-address", help="Ray cluster to join (default: RAY_ADDRESS, else an embedded local Ray on loopback)"
    )
    add_encoder_precision_argument(parser, defaults_shown=True)
    add_compile_argument(parser)
    parser.add_argument(
        "--admin-port",
        type=int,
        help='loopback port of the admin route: POST /reload with {"artifacts": LOCATION} switches every '
        "replica to other artifacts (an updated version of the graph) without dropping a request; GET "
        "/versions shows which each answers from (off unless given; always 127.0.0.1)",
    )
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)  # tests and benchmarks: written once the app answers
    args = parser.parse_args(argv)
    if min(args.replicas, args.max_batch_size, args.max_questions) < 1 or args.batch_wait_ms < 0:
        parser.error("--replicas, --max-batch-size and --max-questions must be >= 1, --batch-wait-ms >= 0")
    from seeder.policy.checkpoint import load_model, locate

    try:
        _, info = load_model(locate(args.model))  # a missing or broken model fails here, before Ray starts
    except DataError as exc:
        print(f"seeder serve: error: {exc}", file=sys.stderr)
        return 2

    from pipelines.ray_runtime import cluster_address, start_ray

    loopback_only = cluster_address(args.ray_address) is None  # start_ray's own loopback-only Ray
    proxy_port = args.port
    if loopback_only and args.replicas == 1 and not args.through_proxy:
        try:
            proxy_port = answer_on_the_replica(args.host, args.port)  # before Serve is imported here
        except ValueError as exc:
            print(f"seeder serve: error: {exc}", file=sys.stderr)
            return 2
    import ray
    from ray import serve

    start_ray(args.ray_address, who="serve")
    board = (
        ray.remote(VersionBoard)
        .options(name=BOARD, namespace=BOARD_NAMESPACE, num_cpus=0, get_if_exists=True)
        .remote(args.artifacts)
    )
    serve.start(proxy_location=args.proxy_location, http_options={"host": args.host, "port": proxy_port})
    app = build_app(
        args.model,
        args.artifacts,
        args.device,
        args.replicas,
        args.max_batch_size,
        args.batch_wait_ms,
        args.max_questions,
        args.cpus_per_replica,
        args.gpus_per_replica,
        args.encoder_precision,
        args.compile,
        loopback_only=loopback_only,
    )
    serve.run(app, name=APP_NAME, route_prefix="/")
    if args.admin_port is not None:
        start_admin(args.admin_port, board, info, args.model, args.replicas)
        print(f"admin route: http://127.0.0.1:{args.admin_port}/reload (POST), /versions (GET)", flush=True)
    print(f"serving {args.model} at http://{args.host}:{args.port}/ ({args.replicas} replica(s)); Ctrl-C stops it", flush=True)
    if args.ready_file:
        with open(args.ready_file, "w") as handle:
            handle.write(f"http://{args.host}:{args.port}/\n")
    # A shell starts a background job (`seeder serve ... &` in a script) with SIGINT ignored, and the process
    # inherits that: Ctrl-C or `kill -INT` would then never reach the loop below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
