"""Where MLflow keeps runs (one rule for every command), and a model URI resolved to a local directory.

Below both the model format (``seeder.policy.checkpoint.locate``) and the tracking of runs
(``seeder.tracking``), which are the only modules that use it; with ``seeder.tracking`` the only modules
that import ``mlflow``, and only inside the functions that need it (MLflow is a slow import and a
local model path never needs it).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from seeder.system.io import DataError

LOCAL_ROOT = Path("runs")
URI_RULE = "MLflow store: MLFLOW_TRACKING_URI when set, else sqlite:///$PWD/runs/mlflow.db (artifacts in runs/mlartifacts)"


def tracking_uri(create: bool = True) -> str:
    """The store every run logs to (``URI_RULE``); ``create=False`` does not make ``runs/``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    if create:
        LOCAL_ROOT.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(LOCAL_ROOT / 'mlflow.db').resolve()}"


REACH_TIMEOUT_S = 5.0
"""How long a remote tracking server gets to accept a connection before a command gives up."""


def check_reachable(uri: str) -> None:
    """A remote (http/https) tracking server must accept a TCP connection within ``REACH_TIMEOUT_S``:
    MLflow's own client retries an unreachable server with backoff for minutes before it fails. Its
    retries are also bounded (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, unless the user set them)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    host, port = parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80)

    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise DataError(
            f"MLflow tracking server {uri} cannot be reached ({exc.strerror or exc}); start it "
            f"(`seeder ui` or `mlflow server`), fix MLFLOW_TRACKING_URI, or pass --experiment none "
            f"where a command offers it"
        ) from None


def local_store_missing(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        return None if path.is_file() else path
    return None


def download_model(model: str) -> Path:
    """A local model directory for ``models:/NAME@ALIAS``, ``runs:/ID/model`` or a local path. Errors
    are one line and name what to set; nothing is created when the store is missing."""
    if not model.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        path = Path(model[len("file://") :] if model.startswith("file://") else model)
        if not path.exists():
            raise DataError(
                f"model {model}: no such file or directory; pass a model directory (RUN/model), "
                "runs:/ID/model or models:/NAME@ALIAS"
            )
        return model_data(path)  # a downloaded MLflow Model holds the model directory under data/
    uri = tracking_uri(create=False)
    missing = local_store_missing(uri)
    if missing is not None:
        raise DataError(
            f"model {model}: no MLflow store at {missing}; run from the directory that holds runs/, or "
            f"set MLFLOW_TRACKING_URI to the store the model was logged in ({URI_RULE})"
        )
    check_reachable(uri)
    quiet_mlflow()
    import mlflow  # MLflow is a slow import: only when this runs
    from mlflow.exceptions import MlflowException  # MLflow is a slow import: only when this runs

    mlflow.set_tracking_uri(uri)
    try:
        return model_data(Path(mlflow.artifacts.download_artifacts(model)))
    except MlflowException as exc:
        first = str(exc).splitlines()[0][:300]
        raise DataError(
            f"model {model}: not found in the MLflow store {uri} ({first}); check the name and alias "
            "with `seeder ui`, or set MLFLOW_TRACKING_URI"
        ) from exc
    except OSError as exc:
        raise DataError(f"model {model}: the MLflow store {uri} cannot be reached ({exc}); check MLFLOW_TRACKING_URI") from exc


def model_data(path: Path) -> Path:
    """The seeder model directory inside a downloaded MLflow Model: its pyfunc flavour's ``data``
    (``data/model`` for a logged model, the root for a run logged before logged models)."""
    if (path / "seeder_model.json").is_file() or not (path / "MLmodel").is_file():
        return path
    from mlflow.models import Model  # MLflow is a slow import: only when this runs

    data = Model.load(str(path / "MLmodel")).flavors.get("python_function", {}).get("data")
    return path / data if data else path


def quiet_mlflow() -> None:
    """No telemetry, and no "Creating initial MLflow database tables..." for every new sqlite store."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
