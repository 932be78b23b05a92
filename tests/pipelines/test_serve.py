"""pipelines/serve.py (``seeder serve``): a trained model behind Ray Serve over loopback; valid and bad
requests, the bind address, and the request parser on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from pipelines.serve import BadRequest, answer_on_the_replica, parse_filters, parse_query, parse_request
from tests.conftest import ENV, free_port


def post(url: str, body: bytes | None, timeout: float = 120, method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ignore_sigint() -> None:
    """Run in the child before exec: SIGINT ignored, as a shell leaves it for a script's background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="module", params=["replica", "proxy"])
def server(request, trained, tmp_path_factory):
    """The service as started by default (its one replica answers HTTP itself) and with --through-proxy
    (Ray Serve's proxy on the port, as with several replicas or on a cluster)."""
    root, _ = trained
    folder = tmp_path_factory.mktemp("serve")
    ready, log = folder / "ready", folder / "serve.log"
    port = free_port()
    seeder = str(Path(sys.executable).parent / "seeder")
    # Its output goes to a file, not a pipe nobody reads (a full pipe would block the server's next log
    # line), and the file is there to read when something goes wrong.
    with open(log, "w") as out:
        # Started with SIGINT ignored, as a script's background job would be: Ctrl-C must still stop it.
        proc = subprocess.Popen(
            [
                seeder,
                "serve",
                "--model",
                str(root / "run" / "model"),
                "--port",
                str(port),
                "--max-questions",
                "1000",
                "--ready-file",
                str(ready),
                *(["--through-proxy"] if request.param == "proxy" else []),
            ],
            env=dict(ENV, RAY_ADDRESS="", RAY_AUTH_MODE="disabled"),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=ignore_sigint,
        )
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"seeder serve did not start: {log.read_text()[-3000:]}")
        time.sleep(1)
    yield f"http://127.0.0.1:{port}/", port, root, request.param
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        # It exits 5-7 s after Ctrl-C here ("Ctrl-C stops it", it says).
        lines = "\n".join(log.read_text().splitlines()[-15:])
        pytest.fail(f"seeder serve ({request.param}) did not exit within 60 s of SIGINT; its last lines:\n{lines}")


@pytest.mark.slow
def test_a_batch_of_questions_gets_the_apis_rankings(server):
    from seeder import Retriever

    url, _, root, _ = server
    retriever = Retriever.load(root / "run" / "model")
    questions = retriever.artifacts.dataset.queries_of("test").column("text").to_pylist()[:4]
    status, reply = post(url, json.dumps({"questions": questions, "k": 5}).encode())
    assert status == 200
    expected = retriever.retrieve(questions, k=5)
    assert [[n["id"] for n in r["nodes"]] for r in reply["results"]] == [[n.id for n in h.nodes] for h in expected]
    assert [r["triples"] for r in reply["results"]] == [[list(t) for t in h.triples] for h in expected]
    status, reply = post(url, json.dumps({"question": "zzzz qqqq no entity here"}).encode())  # dense seeds only
    assert status == 200 and len(reply["results"][0]["nodes"]) == 10


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "not JSON"),
        (b'{"questions": []}', 400, "non-empty list"),
        (b'["a question"]', 400, "JSON object"),
        (b'{"questions": ["ok", 7]}', 400, "question 1"),
        (b'{"questions": ["ok"], "k": 0}', 400, '"k"'),
        (json.dumps({"questions": ["what is it"] * 10_000}).encode(), 413, "at most 1000"),
    ],
)
def test_bad_requests_get_a_4xx_and_the_service_keeps_running(server, body, status, message):
    url, _, _, _ = server
    got, reply = post(url, body)
    assert got == status and message in reply["error"]
    assert post(url, b'{"question": "still there?", "k": 1}')[0] == 200


@pytest.mark.slow
def test_a_get_request_gets_the_same_rankings_as_a_post(server):
    url, _, root, _ = server
    from seeder import Retriever

    questions = Retriever.load(root / "run" / "model").artifacts.dataset.queries_of("test").column("text").to_pylist()[:2]
    status, by_get = post(
        url + "?" + urllib.parse.urlencode([("question", q) for q in questions] + [("k", 4)]), None, method="GET"
    )
    assert status == 200
    by_post = post(url, json.dumps({"questions": questions, "k": 4}).encode())[1]
    # The same rankings, node for node and triple for triple; the scores to rounding (one request's float
    # reductions need not match another's to the last bit: a whole-reply comparison failed once in a suite run).
    scores = [[n.pop("score") for n in r["nodes"]] for r in (*by_get["results"], *by_post["results"])]
    assert by_get == by_post
    half = len(scores) // 2
    assert scores[:half] == [pytest.approx(row, rel=1e-5, abs=1e-6) for row in scores[half:]]
    assert [len(r["nodes"]) for r in by_get["results"]] == [4, 4]
    # A type filter: only that type's nodes, ranked 1, 2, ...; a filter that matches nothing is a 400.
    kind = by_post["results"][0]["nodes"][0]["type"]
    status, filtered = post(url, json.dumps({"questions": questions, "k": 4, "types": [kind]}).encode())
    assert status == 200 and filtered["results"][0]["nodes"]
    assert {n["type"] for r in filtered["results"] for n in r["nodes"]} == {kind}
    assert [n["rank"] for n in filtered["results"][0]["nodes"]] == list(range(1, len(filtered["results"][0]["nodes"]) + 1))
    status, reply = post(url, json.dumps({"questions": questions, "types": ["no such type"]}).encode())
    assert status == 400 and "no node matches" in reply["error"]
    for query, message in (("k=3", '"question"'), ("question=a&k=three", "not 'three'"), ("question=a&k=0", '"k"')):
        got, reply = post(f"{url}?{query}", None, method="GET")
        assert got == 400 and message in reply["error"], (query, reply)
    assert post(url, None, method="PUT")[0] == 405


@pytest.mark.slow
def test_the_service_listens_on_loopback_only(server):
    _, port, _, answered_by = server
    listening = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening and f"*:{port}" not in listening
    # The port belongs to the replica itself, or to Serve's proxy with --through-proxy.
    assert ("ray::ServeRepli" if answered_by == "replica" else "ray::ProxyActor") in listening, listening
    # Nor any other socket of Serve's processes (the replicas' gRPC servers, the proxy, the controller).
    serve_sockets = [
        line.split()
        for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        if any(name in line for name in ("ray::ServeRepli", "ray::ProxyActor", "ray::ServeContr"))
    ]
    assert serve_sockets, "ss shows no Serve process"
    public = [
        local for _, _, _, local, *_ in serve_sockets if not local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:"))
    ]
    assert not public, f"Serve listens beyond loopback on {public}"


def test_the_replica_takes_the_port_only_when_it_is_free(monkeypatch):
    import socket

    for name in (
        "RAY_SERVE_ENABLE_DIRECT_INGRESS",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT",
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
        "RAY_SERVE_PORT_QUARANTINE_S",
    ):
        monkeypatch.setenv(name, "")  # recorded, so that the test's values are undone afterwards
        monkeypatch.delenv(name)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"127.0.0.1:{port} .*pass another --port"):
            answer_on_the_replica("127.0.0.1", port)
        assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" not in os.environ  # nothing set for a port it cannot have
    port = free_port()
    proxy_port = answer_on_the_replica("127.0.0.1", port)
    assert proxy_port != port
    assert (
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"],
        os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"],
        os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"],
    ) == ("1", str(port), str(port + 1))


def test_parse_request_without_a_server():
    assert parse_request(b'{"questions": ["a", "b"], "k": 3}', 10, 100) == (["a", "b"], 3)
    assert parse_request(b'{"question": "a"}', 10, 100) == (["a"], 10)
    with pytest.raises(BadRequest) as info:
        parse_request(json.dumps({"questions": ["a"] * 11}).encode(), 10, 100)
    assert info.value.status == 413


def test_parse_query_without_a_server():
    from starlette.datastructures import QueryParams

    assert parse_query(QueryParams("question=who+directed+Kismet&question=b&k=3"), 10, 100) == (["who directed Kismet", "b"], 3)
    assert parse_query(QueryParams("question=a"), 10, 100) == (["a"], 10)
    for query, status in (
        ("k=3", 400),
        ("question=a&k=x", 400),
        ("question=a&k=101", 400),
        ("question=+&k=1", 400),
        ("&".join(["question=a"] * 11), 413),
    ):
        with pytest.raises(BadRequest) as info:
            parse_query(QueryParams(query), 10, 100)
        assert info.value.status == status, query


def test_parse_filters_without_a_server():
    from starlette.datastructures import QueryParams

    assert parse_filters({"questions": ["a"]}) == {}
    assert parse_filters({"types": ["film"], "where": {"lang": ["en", "fr"]}}) == {
        "types": ["film"],
        "where": {"lang": ["en", "fr"]},
    }
    assert parse_filters(QueryParams("question=a&type=film&type=person")) == {"types": ["film", "person"]}
    for body in ({"types": "film"}, {"types": [1]}, {"where": ["x"]}, {"where": {"a": {"b": 1}}}):
        with pytest.raises(BadRequest) as info:
            parse_filters(body)
        assert info.value.status == 400
