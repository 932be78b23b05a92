"""``seeder serve --admin-port``: a running service switches to an updated version of its graph under
load, with no failed request, every answer naming the version that produced it, and no answer from the
old version once the switch has returned."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ENV, free_port
from tests.datasets import hand_built_artifacts, preprocess_by_hand
from tests.pipelines.test_serve import ignore_sigint, post
from tests.processes import stop_gracefully

CLIENTS = 20


def _versions(tmp_path: Path):
    """(model, v1 artifacts, v2 artifacts, questions, v1 and v2 dataset fingerprints): v2 is an update
    of v1 (two added edges), both built in the encoder's feature space."""
    from seeder.data.store import open_dataset
    from seeder.data.update import update_dataset
    from seeder.policy.checkpoint import load_model

    v1, model, questions = hand_built_artifacts(tmp_path / "v1", "dense", reduce_dim=0)
    changes = tmp_path / "changes.tsv"
    changes.write_text(
        "head\trelation\ttail\top\nentity alpha\trelation a\tentity omega\tadd\nentity beta\trelation b\tentity psi\tadd\n"
    )
    update_dataset(tmp_path / "v1" / "dataset", tmp_path / "v2" / "dataset", triples_path=changes)
    v2 = preprocess_by_hand(tmp_path / "v2" / "dataset", tmp_path / "v2" / "artifacts", load_model(model)[1].config)
    fingerprints = [open_dataset(tmp_path / v / "dataset").fingerprint for v in ("v1", "v2")]
    return model, v1, v2, questions, fingerprints


def _load(url: str, questions: list[str], stop: threading.Event, log: list) -> None:
    """One client: one question per request, back to back, each logged as (start, end, status, version)."""
    rng = np.random.default_rng(len(log))
    mine = []
    while not stop.is_set():
        start = time.monotonic()
        status, reply = post(url, json.dumps({"questions": [questions[rng.integers(len(questions))]], "k": 5}).encode())
        end = time.monotonic()
        mine.append((start, end, status, reply["results"][0]["dataset"] if status == 200 else reply))
    log.append(mine)


@pytest.mark.slow
def test_the_service_switches_to_an_updated_version_under_load_without_an_error(tmp_path):
    model, v1, v2, questions, (version1, version2) = _versions(tmp_path)
    ready, log_file = tmp_path / "ready", tmp_path / "serve.log"
    # ``free_port`` closes the port before the replica binds it seconds later, and another process (a Ray
    # of a test beside this one) may take it in between: Ray Serve then finds "No available ports" for the
    # replica and fails the deployment. It is started again on new ports then; any other failure fails the test.
    for _ in range(3):
        port, admin = free_port(), free_port()
        with open(log_file, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "seeder.cli", "serve", "--model", str(model), "--artifacts", str(v1), "--port", str(port),
                 "--admin-port", str(admin), "--ready-file", str(ready)],
                env=dict(ENV, RAY_ADDRESS="", RAY_AUTH_MODE="disabled"),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=ignore_sigint,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        log = log_file.read_text(errors="replace")
        if ready.exists() or not ("No available ports" in log or "Failed to update the deployments" in log):
            break
        stop_gracefully(proc)
    try:
        assert ready.exists() and proc.poll() is None, log_file.read_text()[-3000:]
        url, admin_url = f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{admin}"
        status, versions = post(admin_url + "/versions", None, method="GET")
        assert status == 200 and [v[:2] for v in versions["replicas"].values()] == [[str(v1), version1]]

        stop, log = threading.Event(), []
        clients = [threading.Thread(target=_load, args=(url, questions, stop, log)) for _ in range(CLIENTS)]
        for client in clients:
            client.start()
        time.sleep(3)  # steady state on v1
        asked = time.monotonic()
        status, switched = post(admin_url + "/reload", json.dumps({"artifacts": str(v2)}).encode())
        returned = time.monotonic()
        time.sleep(3)  # steady state on v2
        stop.set()
        for client in clients:
            client.join(timeout=120)
        assert status == 200 and switched["dataset"] == version2, switched

        requests = [r for client in log for r in client]
        assert len(log) == CLIENTS and len(requests) > 10 * CLIENTS
        assert [r for r in requests if r[2] != 200] == []  # no request failed during the switch
        assert {r[3] for r in requests if r[1] < asked} == {version1}
        assert {r[3] for r in requests if r[0] > returned} == {version2}
        for client in log:  # once a client has seen v2, it never sees v1 again
            seen = [r[3] for r in sorted(client)]
            assert seen == sorted(seen, key=lambda v: v == version2)
        steady = [r[1] - r[0] for r in requests if r[1] < asked or r[0] > returned]
        during = [r[1] - r[0] for r in requests if r[1] >= asked and r[0] <= returned]
        print(f"steady p99 {np.percentile(steady, 99) * 1000:.1f} ms; slowest during the switch "
              f"{max(during, default=0) * 1000:.1f} ms over {len(during)} requests")  # fmt: skip

        # Artifacts the model cannot run on are refused, and the service keeps its version.
        status, reply = post(admin_url + "/reload", json.dumps({"artifacts": str(tmp_path / "nowhere")}).encode())
        assert status == 400 and "nowhere" in reply["error"]
        status, reply = post(admin_url + "/reload", b"{}")
        assert status == 400 and '"artifacts"' in reply["error"]
        assert post(url, json.dumps({"questions": questions[:1]}).encode())[1]["results"][0]["dataset"] == version2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
