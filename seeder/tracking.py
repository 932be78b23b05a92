"""MLflow: where runs go, how models are registered and found again, and the `seeder ui` command.

Default store: ``sqlite:///runs/mlflow.db`` under the current directory (MLflow 3's ``file:`` store is
in maintenance mode), artifacts in ``runs/mlartifacts``. ``MLFLOW_TRACKING_URI`` overrides it, e.g.
``http://127.0.0.1:5000`` for a real ``mlflow server``. Models are logged as an artifact directory
(``model/``: the checkpoint and its config) and registered with ``MlflowClient.create_model_version``,
so ``models:/NAME@champion`` resolves to that directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

LOCAL_ROOT = Path("runs")
MODEL_ARTIFACT = "model"


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    LOCAL_ROOT.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(LOCAL_ROOT / 'mlflow.db').resolve()}"


def setup(experiment: str) -> str:
    """Point MLflow at the tracking store and return the id of ``experiment`` (created if needed)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        # Without this, a sqlite store puts artifacts under ./mlruns of whatever directory ran first.
        location = (LOCAL_ROOT / "mlartifacts" / experiment).resolve().as_uri()
    try:
        return mlflow.create_experiment(experiment, artifact_location=location)
    except mlflow.exceptions.MlflowException:
        return mlflow.get_experiment_by_name(experiment).experiment_id  # created concurrently


def register_model(run_id: str, model_name: str, alias: str | None = "champion", artifact_path: str = MODEL_ARTIFACT) -> int:
    """Register ``runs:/run_id/artifact_path`` as a new version of ``model_name``; return the version."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        client.create_registered_model(model_name)
    except MlflowException:
        pass  # already registered
    run = client.get_run(run_id)
    version = client.create_model_version(
        model_name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run_id
    )
    if alias:
        client.set_registered_model_alias(model_name, alias, version.version)
    return int(version.version)


def resolve_model(model: str) -> Path:
    """A local model directory or checkpoint for a path, ``runs:/...`` or ``models:/NAME@alias`` URI."""
    if model.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        import mlflow

        mlflow.set_tracking_uri(tracking_uri())
        return Path(mlflow.artifacts.download_artifacts(model))
    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"model {model}: no such file or directory; give a checkpoint path or models:/NAME@champion")
    return path


def _ui(args: argparse.Namespace) -> int:
    uri = tracking_uri()
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)]
    print(f"MLflow UI for {uri} at http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    return subprocess.call(cmd, env=env)


def register(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser("ui", help="start the MLflow UI on this machine's loopback to compare runs and pick a model")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=_ui)
