"""Serving benchmark: a trained model through the Python API and through `seeder serve` over loopback.

    python benchmarks/bench_serve.py --model runs/metaqa/model/model [--split test] [--questions 400]

In one run, on the questions of a split (their text only: every question goes through encoding,
seeding, K-HOP-WITH-FILTERING, expansion and ranking):

1. ``Retriever.load`` time;
2. the API, one question per call: p50 / p95 / p99 latency;
3. the API, batches of ``--batch`` questions: questions per second;
   2 and 3 run with the question encoder in ``--encoder-precision`` (default ``auto``: bfloat16 on
   CPUs that compute it natively) and, when that differs, in the artifacts' precision too, the
   reference whose rankings equal ``seeder evaluate``'s, interleaved in blocks of questions; the ratio
   is printed;
4. ``seeder serve`` started on 127.0.0.1: one question per request from 1 client (latency), from
   ``--clients`` concurrent clients (errors, throughput), and client-side batches of
   ``--request-batch`` questions (throughput). Each client keeps its HTTP/1.1 connection open across
   its requests, as HTTP client libraries and load generators do. The single client sends each
   question as a POST and as a ``GET /?question=...`` (through Serve's proxy, ``--through-proxy``, a
   GET has no body for the replica to fetch back), the two forms alternating in blocks of
   ``INTERLEAVE`` questions, and is measured once more with a new connection per request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


INTERLEAVE = 25
"""Questions a retriever answers in a row before the other's turn (``measure``)."""


def percentiles(ms: list[float]) -> str:
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return f"p50 {p50:.1f} ms  p95 {p95:.1f} ms  p99 {p99:.1f} ms"


def post(
    url: str, payload: dict, timeout: float = 300, connection: http.client.HTTPConnection | None = None, as_get: bool = False
) -> tuple[int, float]:
    """POST ``payload``; (status, ms). With ``connection``, over that kept-alive connection (as HTTP
    clients and load generators send requests), else over a new connection for this request.
    ``as_get``: a single-question payload as ``GET /?question=...&k=...`` instead, with no body."""
    method, body, headers = "POST", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    path = urllib.parse.urlsplit(url).path or "/"
    if as_get:
        method, body, headers = "GET", None, {}
        path += "?" + urllib.parse.urlencode({"question": payload["question"], "k": payload.get("k", 10)})
    start = time.perf_counter()
    if connection is not None:
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status, (time.perf_counter() - start) * 1000
        except (http.client.HTTPException, OSError):
            connection.close()  # reconnects on the next request
            return 0, (time.perf_counter() - start) * 1000
    request = urllib.request.Request(urllib.parse.urljoin(url, path), data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError):
        status = 0
    return status, (time.perf_counter() - start) * 1000


def load_clients(
    url: str, payloads: list[dict], clients: int, keep_alive: bool = True, as_get: bool = False
) -> tuple[list[float], int, float]:
    """Send ``payloads`` from ``clients`` threads, each over one kept-alive connection (or a new one per
    request), as POSTs (or GETs, ``post``'s ``as_get``); (latencies ms, errors, wall seconds)."""
    latencies, errors, lock, cursor = [], [0], threading.Lock(), [0]
    address = urllib.parse.urlsplit(url)

    def worker():
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=300) if keep_alive else None
        while True:
            with lock:
                if cursor[0] >= len(payloads):
                    return
                payload = payloads[cursor[0]]
                cursor[0] += 1
            status, ms = post(url, payload, connection=connection, as_get=as_get)
            with lock:
                latencies.append(ms)
                errors[0] += status != 200

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0], time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from seeder.cli.arguments import add_compile_argument
    from seeder.serving.retriever import ENCODER_PRECISIONS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory, runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts (default: the ones the model was trained on)")
    parser.add_argument("--split", default="test", help="split whose question texts are sent")
    parser.add_argument("--questions", type=int, default=400, help="questions per measurement")
    parser.add_argument("--batch", type=int, default=256, help="API batch size")
    parser.add_argument("--clients", type=int, default=50, help="concurrent HTTP clients")
    parser.add_argument("--request-batch", type=int, default=64, help="questions per request in the client-side batching run")
    parser.add_argument("--replicas", type=int, default=1, help="serve replicas")
    parser.add_argument(
        "--cpus-per-replica",
        type=float,
        default=0,
        help="CPUs (and torch threads) per replica; 0: this machine's cores / --replicas",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of the API runs; 0: torch's default (every core). A call is cut into one part per "
        "thread, each on one thread (seeder.serving.retriever.Retriever._parts); a replica uses its CPUs",
    )
    parser.add_argument(
        "--encoder-precision",
        default="auto",
        choices=ENCODER_PRECISIONS,
        help="number format of the question encoder on CPU (seeder.serving.retriever.ENCODER_PRECISIONS) for the "
        "API and the service; when it differs from the artifacts', the API is also measured with theirs",
    )
    add_compile_argument(parser)
    parser.add_argument(
        "--through-proxy",
        action="store_true",
        help="send the requests through Ray Serve's HTTP proxy (seeder serve --through-proxy) instead of to the "
        "one replica, which answers HTTP itself by default",
    )
    parser.add_argument("--skip-serve", action="store_true", help="measure the API only")
    parser.add_argument("--device", default="cpu", help="torch device of the policy and the encoder (cpu, cuda)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from seeder import Retriever
    from seeder.features.embed import is_gpu

    start = time.perf_counter()
    retriever = Retriever.load(
        args.model, artifacts=args.artifacts, encoder_precision=args.encoder_precision, compiled=args.compile, device=args.device
    )
    load_s = time.perf_counter() - start
    questions = retriever.artifacts.dataset.queries_of(args.split).column("text").to_pylist()
    rng = np.random.default_rng(0)
    questions = [questions[i] for i in rng.permutation(len(questions))[: max(args.questions, args.batch)]]
    start = time.perf_counter()
    retriever.warm_up()
    warm_s = time.perf_counter() - start
    print(
        f"model {args.model}: Retriever.load {load_s:.2f} s, warm_up {warm_s:.2f} s (builds the indexes"
        + (", compiles the networks)" if args.compile else ")")
    )

    def measure(runs: dict[str, Retriever]) -> dict[str, tuple[float, float]]:
        """p50 of one question per call and questions/s in batches, for every retriever of ``runs``:
        interleaved in blocks of INTERLEAVE questions (and batch by batch, the first one alternating),
        so that a shared machine's drift weighs on each alike. Blocks, not single questions: each
        retriever's weights stay in the CPU caches as they would in a service."""
        single: dict[str, list[float]] = {label: [] for label in runs}
        seconds = dict.fromkeys(runs, 0.0)
        batches = [questions[i : i + args.batch] for i in range(0, len(questions), args.batch)]
        asked = questions[: args.questions]
        for i, block in enumerate(asked[lo : lo + INTERLEAVE] for lo in range(0, len(asked), INTERLEAVE)):
            for label in list(runs)[:: 1 if i % 2 == 0 else -1]:
                for q in block:
                    t = time.perf_counter()
                    runs[label].retrieve([q], k=10)
                    single[label].append((time.perf_counter() - t) * 1000)
        for i, b in enumerate(batches):
            for label in list(runs)[:: 1 if i % 2 == 0 else -1]:
                t = time.perf_counter()
                runs[label].retrieve(b, k=10)
                seconds[label] += time.perf_counter() - t
        out = {}
        for label in runs:
            rate = sum(map(len, batches)) / seconds[label]
            print(f"API, {label}, one question per call ({len(single[label])}): {percentiles(single[label])}")
            print(f"API, {label}, batches of {args.batch}: {rate:.0f} questions/s")
            out[label] = float(np.median(single[label])), rate
        return out

    chosen = f"questions encoded in {retriever.query_precision}"
    runs = {chosen: retriever}
    if not retriever.on_gpu and retriever.query_precision != retriever.config.embed.cpu_precision:
        # The reference in the same run: the artifacts' own precision (exact rankings of `seeder evaluate`).
        reference = Retriever.load(args.model, artifacts=args.artifacts, compiled=args.compile, device=args.device)
        reference.warm_up()
        runs[f"reference: questions encoded in {reference.query_precision}"] = reference
        del reference
    results = measure(runs)
    p50, rate = results[chosen]
    for label, (ref_p50, ref_rate) in results.items():
        if label != chosen:
            print(
                f"{retriever.query_precision} / {runs[label].query_precision}: p50 {ref_p50 / p50:.2f}x faster, "
                f"batches {rate / ref_rate:.2f}x the questions/s (measured interleaved)"
            )
    del runs  # the reference's memory back before the service starts
    if args.skip_serve:
        return

    port = free_port()
    ready = Path(tempfile.mkdtemp()) / "ready"
    seeder = str(Path(sys.executable).parent / "seeder")
    cpus = args.cpus_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    answered_by = "Serve's proxy" if args.through_proxy or args.replicas > 1 else "the replica itself"
    print(f"seeder serve: {args.replicas} replica(s) of {cpus:g} CPU(s); HTTP answered by {answered_by}")
    proc = subprocess.Popen(
        [
            seeder,
            "serve",
            "--model",
            args.model,
            "--port",
            str(port),
            "--replicas",
            str(args.replicas),
            "--cpus-per-replica",
            str(cpus),
            "--encoder-precision",
            args.encoder_precision,
            "--device",
            args.device,
            *(["--gpus-per-replica", "1"] if is_gpu(args.device) else []),
            *(["--compile"] if args.compile else []),
            *(["--through-proxy"] if args.through_proxy else []),
            "--ready-file",
            str(ready),
            *(["--artifacts", args.artifacts] if args.artifacts else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise SystemExit("seeder serve exited before it was ready")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/"
        post(url, {"question": questions[0], "k": 10})
        payloads = [{"question": q, "k": 10} for q in questions[: args.questions]]
        # POSTs and GETs from one client, alternating in blocks of INTERLEAVE questions so that the
        # service's first minutes and the machine's drift weigh on both; each block keeps one connection
        # alive (so 1 request in INTERLEAVE of each form also opens it).
        by_form = {"POST": [], "GET": []}
        errors = 0
        for i, lo in enumerate(range(0, len(payloads), INTERLEAVE)):
            for form in ("POST", "GET")[:: 1 if i % 2 == 0 else -1]:
                latencies, failed, _ = load_clients(url, payloads[lo : lo + INTERLEAVE], 1, as_get=form == "GET")
                by_form[form] += latencies
                errors += failed
        for form, latencies in by_form.items():
            print(
                f"serve, 1 client, one question per {form} request ({len(latencies)}): {percentiles(latencies)}, "
                f"{errors} errors in both"
            )
        latencies, errors, _ = load_clients(url, payloads, 1, keep_alive=False)
        print(
            f"serve, 1 client, one question per request, a new connection each ({len(latencies)}): "
            f"{percentiles(latencies)}, {errors} errors"
        )
        latencies, errors, wall = load_clients(url, payloads, args.clients)
        print(
            f"serve, {args.clients} clients, one question per request: {len(payloads) / wall:.0f} questions/s, "
            f"{percentiles(latencies)}, {errors} errors"
        )
        batched = [
            {"questions": questions[i : i + args.request_batch], "k": 10} for i in range(0, len(questions), args.request_batch)
        ]
        latencies, errors, wall = load_clients(url, batched * 2, 4)
        total = 2 * sum(len(p["questions"]) for p in batched)
        print(
            f"serve, 4 clients, {args.request_batch} questions per request: {total / wall:.0f} questions/s, "
            f"{percentiles(latencies)} per request, {errors} errors"
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
