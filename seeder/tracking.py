"""MLflow: where runs go, how models are registered and found again, and the `seeder ui` command.

Default store: ``sqlite:///runs/mlflow.db`` under the current directory (MLflow 3's ``file:`` store is
in maintenance mode), artifacts in ``runs/mlartifacts``. ``MLFLOW_TRACKING_URI`` overrides it, e.g.
``http://127.0.0.1:5000`` for a real ``mlflow server``. Models are logged as an artifact directory
(``model/``: the checkpoint and its config) and registered with ``MlflowClient.create_model_version``,
so ``models:/NAME@champion`` resolves to that directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


# -- training runs: parameters, per-epoch metrics, the model directory and a training-curve plot --------

# Per-epoch keys shown in the training-curve plot, one panel each (losses share the first panel).
CURVE_PANELS = (
    ("loss", ("loss", "rl_loss", "bpr_loss")),
    ("reward", ("mean_reward",)),
    ("validation", ("val_hit_at_1", "val_hit_at_5", "val_mrr", "val_recall_at_20")),
)
RUN_FILE = "mlflow_run.json"


def client(uri: str | None = None):
    """An ``MlflowClient`` on ``uri`` (default: ``tracking_uri()``); no active run is needed to log."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri or tracking_uri())


def start_or_resume_run(experiment: str, run_name: str, run_dir: str | Path, resume: bool) -> tuple[str, bool]:
    """The MLflow run of a training run directory: the one recorded in ``run_dir/mlflow_run.json``
    when resuming (so a resumed run keeps one metric history), else a new run. -> (run_id, resumed)."""
    record = Path(run_dir) / RUN_FILE
    uri = tracking_uri()
    if resume and record.is_file():
        saved = json.loads(record.read_text())
        if saved.get("tracking_uri") == uri:
            try:
                client(uri).get_run(saved["run_id"])
                return saved["run_id"], True
            except Exception:  # deleted run or another store: start a new one below
                pass
    experiment_id = setup(experiment)
    run = client(uri).create_run(experiment_id, run_name=run_name)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"run_id": run.info.run_id, "tracking_uri": uri, "experiment": experiment}))
    return run.info.run_id, False


def log_params(run_id: str, params: dict[str, Any], uri: str | None = None) -> None:
    """Log flat parameters (e.g. ``seeder.config.flatten(config)``), in batches of MLflow's limit."""
    from mlflow.entities import Param

    items = [Param(key, str(value)[:6000]) for key, value in params.items()]
    mlflow_client = client(uri)
    for lo in range(0, len(items), 100):
        mlflow_client.log_batch(run_id, params=items[lo : lo + 100])


def log_epoch_metrics(run_id: str, metrics: dict[str, Any], step: int, uri: str | None = None) -> None:
    """Log one epoch's numeric metrics at ``step``; non-finite values are skipped (MLflow rejects NaN
    in some stores and a NaN point hides the curve)."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    batch = [
        Metric(key, float(value), stamp, step)
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ]
    if batch:
        client(uri).log_batch(run_id, metrics=batch)


def plot_training_curves(history: list[dict[str, Any]], path: str | Path) -> Path:
    """One PNG with a panel per group of ``CURVE_PANELS`` over epochs (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    epochs = [row.get("epoch", i + 1) for i, row in enumerate(history)]
    fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(5 * len(CURVE_PANELS), 3.6))
    for ax, (title, keys) in zip(axes, CURVE_PANELS):
        for key in keys:
            points = [(e, row[key]) for e, row in zip(epochs, history) if key in row]
            if points:
                ax.plot(*zip(*points), marker="o", label=key)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def log_training_outputs(
    run_id: str, model_dir: str | Path, plot: str | Path | None = None, uri: str | None = None, status: str = "FINISHED"
) -> None:
    """Upload the model directory as artifact ``model`` (what ``register_model`` points at), the
    training-curve plot at the artifact root, and close the run with ``status``."""
    mlflow_client = client(uri)
    mlflow_client.log_artifacts(run_id, str(model_dir), artifact_path=MODEL_ARTIFACT)
    if plot is not None:
        mlflow_client.log_artifact(run_id, str(plot))
    mlflow_client.set_terminated(run_id, status=status)


def ui_hint() -> str:
    """How to open the UI on the store this process logs to."""
    uri = tracking_uri()
    prefix = f"MLFLOW_TRACKING_URI={uri} " if os.environ.get("MLFLOW_TRACKING_URI") else ""
    return f"{prefix}seeder ui   (then open http://127.0.0.1:5000)"
