import time

import pytest

from seeder import tracking
from seeder.system import mlflow_store
from seeder.system.io import DataError
from tests.conftest import free_port


def test_an_unreachable_tracking_server_is_a_one_line_error_within_seconds(monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for call in (lambda: tracking.setup("x"), lambda: tracking.download_model("models:/m@champion"), lambda: tracking.client()):
        start = time.perf_counter()
        with pytest.raises(DataError, match=f"MLflow tracking server {uri} cannot be reached.*MLFLOW_TRACKING_URI"):
            call()
        assert time.perf_counter() - start < mlflow_store.REACH_TIMEOUT_S + 2


def test_a_local_store_needs_no_server(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    tracking.check_reachable(f"sqlite:///{tmp_path}/mlflow.db")  # nothing to reach: no error
    assert tracking.setup("local-experiment")
