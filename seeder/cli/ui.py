"""``seeder ui``: the MLflow UI on loopback, over the store every run logs to."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from seeder.tracking import tracking_uri


def run(args: argparse.Namespace) -> int:
    uri = tracking_uri()
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)]
    print(f"MLflow UI for {uri} at http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    # No MLflow job runner: its worker processes run MLflow's GenAI jobs, which nothing here submits.
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    return subprocess.call(cmd, env=env)


def register(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser("ui", help="start the MLflow UI on this machine's loopback to compare runs and pick a model")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=run)
