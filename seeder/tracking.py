"""MLflow, spoken in one place: where runs go, training runs and sweep trials, the logged model,
the registry, and the `seeder ui` command. No other module imports ``mlflow`` but
``seeder.system.mlflow_store`` (the store rule and model URIs, which the model format needs too).

**Tracking store, one rule:** ``MLFLOW_TRACKING_URI`` when set (e.g. ``http://127.0.0.1:5000`` for a
real ``mlflow server``), else ``sqlite:///$PWD/runs/mlflow.db`` with artifacts in ``runs/mlartifacts``.
Reading a ``models:/`` or ``runs:/`` URI never creates a store: a missing one is a one-line error
that says what to set.

**The model.** Every training run (plain, Ray Train, sweep trial) logs one model directory
(``seeder.policy.checkpoint``: ``seeder_model.json`` + ``weights.pt``) as an MLflow 3 logged model named
``model`` (``mlflow.pyfunc.log_model(name="model", loader_module="seeder.tracking", data_path=...)``):
it lists in the experiment's Models tab and in ``mlflow.search_logged_models``, with the run's metrics
of the model's epoch linked to it, and it loads through this module (``_load_pyfunc``: no pickle).
A sweep trial whose best epoch improves logs one more, and the newest is the run's model.
``runs:/ID/model``, ``models:/NAME@champion`` and ``mlflow.pyfunc.load_model(...).predict(...)``
(a list of questions, or a frame with a ``question`` column) all reach it, and so does
``mlflow models serve``; ``seeder.policy.checkpoint.locate`` finds the directory inside.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from seeder.config import flatten
from seeder.system.io import DataError
from seeder.system.mlflow_store import (  # noqa: F401 (re-exported: the one place callers reach MLflow)
    LOCAL_ROOT,
    URI_RULE,
    check_reachable,
    download_model,
    local_store_missing,
    quiet_mlflow,
    tracking_uri,
)

MODEL_ARTIFACT = "model"  # == seeder.policy.checkpoint.MODEL_DIR
DESCRIPTION_FILE = "seeder_model.json"  # == seeder.policy.checkpoint.DESCRIPTION_FILE
EPOCH_TAG = "seeder.epoch"  # a logged model's tag: the training epoch whose weights it holds


def setup(experiment: str) -> str:
    """Point MLflow at the tracking store and return the id of ``experiment`` (created if needed)."""
    quiet_mlflow()
    import mlflow  # MLflow is a slow import: only when this runs

    uri = tracking_uri()
    check_reachable(uri)
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
    """Register the run's logged model ``artifact_path`` (or, for a run logged before logged models,
    its ``runs:/run_id/artifact_path`` artifacts) as a new version of ``model_name``."""
    import mlflow  # MLflow is a slow import: only when this runs
    from mlflow.exceptions import MlflowException  # MLflow is a slow import: only when this runs

    mlflow_client = client()
    try:
        mlflow_client.create_registered_model(model_name)
    except MlflowException:
        pass  # already registered
    mlflow.set_tracking_uri(tracking_uri())
    logged = logged_model_of(mlflow_client, run_id, artifact_path)
    if logged is not None:
        version = mlflow_client.create_model_version(
            model_name, source=f"models:/{logged.model_id}", run_id=run_id, model_id=logged.model_id
        )
    else:
        version = mlflow_client.create_model_version(model_name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id)
    if alias:
        mlflow_client.set_registered_model_alias(model_name, alias, version.version)
    return int(version.version)


def logged_model_of(mlflow_client, run_id: str, name: str = MODEL_ARTIFACT, epoch: int | None = None):
    """The run's newest logged model called ``name`` (the one ``runs:/run_id/name`` resolves to), or
    with ``epoch`` the one of that epoch; None when there is none."""
    experiment_id = mlflow_client.get_run(run_id).info.experiment_id
    found = mlflow_client.search_logged_models(
        experiment_ids=[experiment_id],
        filter_string=f"name = '{name}' AND source_run_id = '{run_id}'",
        order_by=[{"field_name": "creation_timestamp", "ascending": False}],
    )
    if epoch is not None:
        found = [m for m in found if m.tags.get(EPOCH_TAG) == str(epoch)]
    return found[0] if found else None


# -- training runs: parameters, per-epoch metrics, the model directory and a training-curve plot --------

# Per-epoch keys shown in the training-curve plot, one panel each (losses share the first panel).
CURVE_PANELS = (
    ("loss", ("loss", "loss_reinforce", "loss_bpr")),
    ("reward", ("reward",)),
    ("validation", ("val_hit_at_1", "val_hit_at_5", "val_mrr", "val_recall_at_20")),
)
RUN_FILE = "mlflow_run.json"


def client(uri: str | None = None):
    """An ``MlflowClient`` on ``uri`` (default: ``tracking_uri()``); no active run is needed to log."""
    quiet_mlflow()
    from mlflow import MlflowClient  # MLflow is a slow import: only when this runs

    uri = uri or tracking_uri()
    check_reachable(uri)
    return MlflowClient(tracking_uri=uri)


def log_params(run_id: str, params: dict[str, Any], uri: str | None = None) -> None:
    """Log flat parameters (e.g. ``seeder.config.flatten(config)``), in batches of MLflow's limit."""
    from mlflow.entities import Param  # MLflow is a slow import: only when this runs

    items = [Param(key, str(value)[:6000]) for key, value in params.items()]
    mlflow_client = client(uri)
    for lo in range(0, len(items), 100):
        mlflow_client.log_batch(run_id, params=items[lo : lo + 100])


def log_epoch_metrics(run_id: str, metrics: dict[str, Any], step: int, uri: str | None = None) -> None:
    """Log one epoch's numeric metrics at ``step``; non-finite values are skipped (MLflow rejects NaN
    in some stores and a NaN point hides the curve)."""
    from mlflow.entities import Metric  # MLflow is a slow import: only when this runs

    stamp = int(time.time() * 1000)
    batch = [
        Metric(key, float(value), stamp, step)
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ]
    mlflow_client = client(uri)
    for lo in range(0, len(batch), 900):  # MLflow takes at most 1,000 metrics per batch
        mlflow_client.log_batch(run_id, metrics=batch[lo : lo + 900])


def log_report_run(experiment: str, name: str, params: dict[str, Any], metrics: dict[str, float], files: list[Path]) -> str:
    """A finished one-shot run (a benchmark): parameters, metrics at step 0, files as artifacts."""
    experiment_id = setup(experiment)
    mlflow_client = client()
    run_id = mlflow_client.create_run(experiment_id, run_name=name, tags={"seeder.kind": "benchmark"}).info.run_id
    log_params(run_id, params)
    log_epoch_metrics(run_id, metrics, step=0)
    for path in files:
        mlflow_client.log_artifact(run_id, str(path))
    mlflow_client.set_terminated(run_id, status="FINISHED")
    return run_id


def plot_training_curves(history: list[dict[str, Any]], path: str | Path) -> Path:
    """One PNG with a panel per group of ``CURVE_PANELS`` over epochs (matplotlib, Agg backend)."""
    import matplotlib  # plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plots only

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


def model_signature():
    """Ranked nodes out and the ``k`` parameter. No input schema: questions come as a list of strings
    or as a frame with a ``question`` column, which ``_PyfuncRetriever.predict`` checks itself. MLflow's
    column check cannot pass both (a list becomes an unnamed column, a named schema refuses it, an
    unnamed one takes a frame's first column whatever its name)."""
    from mlflow.models import ModelSignature  # MLflow is a slow import: only when this runs
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema  # MLflow is a slow import: only when this runs

    return ModelSignature(
        inputs=None,
        outputs=Schema(
            [
                ColSpec("string", "question"),
                ColSpec("long", "rank"),
                ColSpec("long", "node"),
                ColSpec("string", "name"),
                ColSpec("double", "score"),
                ColSpec("long", "step"),
            ]
        ),
        params=ParamSchema([ParamSpec("k", "long", 20)]),
    )


def log_model(run_id: str, model_dir: str | Path, uri: str | None = None) -> str:
    """Log a seeder model directory as the run's MLflow 3 logged model ``model`` and return its id.

    The model is ``mlflow.pyfunc.log_model(name="model", loader_module="seeder.tracking", ...)``: the
    directory under ``data/``, a pyfunc flavour that loads through this module (code from the
    installed package, no pickle), and ``model_signature()``. It is created with the run as its source
    and the run's parameters, recorded as the run's output at the model's epoch, and the run's metrics
    of that epoch are linked to it. One logged model per epoch: logging the same epoch again (a
    resumed run) rewrites it, a later epoch (a sweep trial whose best improved) adds the run's newest,
    which ``runs:/ID/model`` and ``register_model`` resolve to."""
    quiet_mlflow()
    import mlflow  # MLflow is a slow import: only when this runs
    from mlflow.entities import LoggedModelOutput, Metric  # MLflow is a slow import: only when this runs

    uri = uri or tracking_uri()
    mlflow_client = client(uri)
    mlflow.set_tracking_uri(uri)  # mlflow.pyfunc.log_model finalises the model through the global store
    model_dir = Path(model_dir)
    description = json.loads((model_dir / DESCRIPTION_FILE).read_text()) if (model_dir / DESCRIPTION_FILE).is_file() else {}
    epoch = int(description.get("epoch", 0))
    run = mlflow_client.get_run(run_id)
    logged = logged_model_of(mlflow_client, run_id, epoch=epoch)
    created = logged is None
    if created:
        logged = mlflow_client.create_logged_model(
            experiment_id=run.info.experiment_id,
            name=MODEL_ARTIFACT,
            source_run_id=run_id,
            params={key: value[:6000] for key, value in run.data.params.items()},
            tags={EPOCH_TAG: str(epoch)},
            model_type="seeder-retriever",
        )
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")  # loading it needs the artifacts
        data = Path(tmp) / MODEL_ARTIFACT
        shutil.copytree(model_dir, data, ignore=shutil.ignore_patterns("MLmodel"))
        mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT,
            loader_module="seeder.tracking",
            data_path=str(data),
            signature=model_signature(),
            pip_requirements=[_requirement()],
            model_id=logged.model_id,
        )
    if created:
        mlflow_client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=epoch)])
        # The run's metrics of the model's epoch, linked to the model (the description's validation
        # metrics when the run logged none at that epoch).
        stamp = int(time.time() * 1000)
        linked = [
            Metric(m.key, m.value, m.timestamp, m.step, model_id=logged.model_id, run_id=run_id)
            for key in run.data.metrics
            for m in mlflow_client.get_metric_history(run_id, key)
            if m.step == epoch
        ] or [
            Metric(key, float(value), stamp, epoch, model_id=logged.model_id, run_id=run_id)
            for key, value in description.get("metrics", {}).items()
        ]
        for lo in range(0, len(linked), 900):
            mlflow_client.log_batch(run_id, metrics=linked[lo : lo + 900])
    return logged.model_id


def _requirement() -> str:
    """This package as the model's pip requirement (MLflow would otherwise load the model to guess)."""
    try:
        return f"seeder=={importlib.metadata.version('seeder')}"
    except importlib.metadata.PackageNotFoundError:
        return "seeder"


class _PyfuncRetriever:
    """What ``mlflow.pyfunc.load_model`` returns for a seeder model: ``predict`` takes a frame with a
    ``question`` column (or a list of strings) and returns one row per (question, rank)."""

    def __init__(self, path: str):
        from seeder.serving.retriever import Retriever  # the retriever and its kernels load with the model only

        self.retriever = Retriever.load(path)

    def predict(self, model_input, params: dict | None = None):
        import pandas as pd  # pandas only for this table

        if isinstance(model_input, pd.DataFrame):
            if "question" in model_input.columns:
                column = model_input["question"]
            elif len(model_input.columns) == 1:  # e.g. pd.DataFrame(questions): one unnamed column
                column = model_input.iloc[:, 0]
            else:
                raise DataError(f"predict: the input frame has columns {list(model_input.columns)}; it needs 'question'")
            questions = column.astype(str).tolist()
        elif isinstance(model_input, pd.Series):
            questions = model_input.astype(str).tolist()
        else:
            questions = [str(q) for q in (model_input if isinstance(model_input, (list, tuple)) else [model_input])]
        k = int((params or {}).get("k", 20))
        return self.retriever.retrieve_frame(questions, k=k)


def _load_pyfunc(path: str) -> _PyfuncRetriever:
    """MLflow's pyfunc loader hook (``loader_module: seeder.tracking`` in the MLmodel file)."""
    return _PyfuncRetriever(path)


class TrainingRun:
    """The MLflow run of one training run or sweep trial: parameters, one row of metrics per epoch
    (the names of ``seeder.training.loop``), the training curve and the model. Talks through ``MlflowClient``
    only (no global active run), so concurrent trials and Ray workers do not step on each other."""

    def __init__(self, run_id: str, uri: str):
        self.run_id, self.uri = run_id, uri
        self.logged_epochs = {m.step for m in client(uri).get_metric_history(run_id, "loss")}

    @classmethod
    def attach(cls, run_id: str, uri: str) -> "TrainingRun":
        """The same run from another process (a Ray Train worker)."""
        return cls(run_id, uri)

    @classmethod
    def start(
        cls, experiment: str, name: str, run_dir: str | Path | None, resume: bool, config, extra: dict | None = None
    ) -> "TrainingRun":
        """A new run, or with ``resume`` the one recorded in ``run_dir`` (a resumed run keeps one
        metric history)."""
        uri = tracking_uri()
        mlflow_client = client(uri)
        record = Path(run_dir) / RUN_FILE if run_dir is not None else None
        if resume and record is not None and record.is_file():
            saved = json.loads(record.read_text())
            if saved.get("tracking_uri") == uri:
                try:
                    mlflow_client.get_run(saved["run_id"])
                    mlflow_client.update_run(saved["run_id"], status="RUNNING")
                    return cls(saved["run_id"], uri)
                except Exception:  # deleted run or another store: start a new one below
                    pass
        run = mlflow_client.create_run(setup(experiment), run_name=name, tags={"seeder.kind": "train"})
        if record is not None:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({"run_id": run.info.run_id, "tracking_uri": uri, "experiment": experiment}))
        log_params(run.info.run_id, {**run_params(config), **(extra or {})}, uri)
        return cls(run.info.run_id, uri)

    @classmethod
    def child(cls, uri: str, experiment_id: str, parent_run_id: str, name: str, config, swept: dict[str, str]) -> "TrainingRun":
        """A sweep trial's run under the sweep's parent run, reopened when the trial resumes."""
        mlflow_client = client(uri)
        found = find_child_runs(mlflow_client, experiment_id, parent_run_id, name)
        if found:
            mlflow_client.update_run(found[0].info.run_id, status="RUNNING")
            return cls(found[0].info.run_id, uri)
        run = mlflow_client.create_run(
            experiment_id, run_name=name, tags={"mlflow.parentRunId": parent_run_id, "seeder.trial": name, "seeder.kind": "trial"}
        )
        log_params(run.info.run_id, {**run_params(config), **swept}, uri)
        return cls(run.info.run_id, uri)

    def log_epoch(self, metrics: dict[str, Any]) -> None:
        """One epoch's row; an epoch already logged (redone after a resume) keeps its first record."""
        epoch = int(metrics["epoch"])
        if epoch in self.logged_epochs:
            return
        self.logged_epochs.add(epoch)
        log_epoch_metrics(self.run_id, {k: v for k, v in metrics.items() if k != "epoch"}, step=epoch, uri=self.uri)

    def log_model(self, model_dir: str | Path) -> None:
        log_model(self.run_id, model_dir, self.uri)

    def finish(self, model_dir: str | Path | None, history: list[dict[str, Any]], status: str = "FINISHED") -> None:
        """Log the model and the training curve, and close the run."""
        mlflow_client = client(self.uri)
        if model_dir is not None:
            self.log_model(model_dir)
        if history:
            with tempfile.TemporaryDirectory() as tmp:
                mlflow_client.log_artifact(self.run_id, str(plot_training_curves(history, Path(tmp) / "training_curve.png")))
        mlflow_client.set_terminated(self.run_id, status=status)

    def fail(self, error: str) -> None:
        mlflow_client = client(self.uri)
        mlflow_client.set_tag(self.run_id, "seeder.error", error[:4000])
        mlflow_client.set_terminated(self.run_id, status="FAILED")


def run_params(config) -> dict[str, Any]:
    """What a training run records: the sections that shape the model (model, train, eval) and those
    that built its artifacts (embed, reduce, seed, expand, prior); not the synthetic-graph or
    baseline settings of unrelated stages."""
    keep = ("model", "train", "eval", "embed", "reduce", "seed", "expand", "prior")
    return {k: v for k, v in flatten(config).items() if k.split(".")[0] in keep}


def find_child_runs(mlflow_client, experiment_id: str, parent_run_id: str, name: str | None = None) -> list:
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
    if name is not None:
        query += f" and tags.`seeder.trial` = '{name}'"
    return mlflow_client.search_runs([experiment_id], filter_string=query, max_results=10_000)


def ui_hint() -> str:
    """How to open the UI on the store this process logs to."""
    uri = tracking_uri()
    prefix = f"MLFLOW_TRACKING_URI={uri} " if os.environ.get("MLFLOW_TRACKING_URI") else ""
    return f"{prefix}seeder ui   (then open http://127.0.0.1:5000)"
