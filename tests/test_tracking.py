import json
import shutil
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


def test_the_model_is_an_mlflow_3_logged_model_with_the_runs_metrics_and_predicts_from_lists_and_frames(tmp_path, monkeypatch):
    """A training run's model, logged on a real sqlite store: listed by ``mlflow.search_logged_models``
    as the run's output with the metrics of its epoch linked, loaded by MLflow's pyfunc loader from
    ``runs:/``, ``models:/ID`` and the registry alias, and answering a list of questions as it answers
    a frame with a ``question`` column. Logging again rewrites the run's one logged model."""
    import mlflow
    import pandas as pd

    from tests.datasets import hand_built_artifacts

    _, model_dir, texts = hand_built_artifacts(tmp_path / "hand", "dense")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    experiment_id = tracking.setup("logged-models")
    mlflow_client = tracking.client()
    run_id = mlflow_client.create_run(experiment_id, run_name="train").info.run_id
    tracking.log_params(run_id, {"model.hidden_dim": 8})
    tracking.log_epoch_metrics(run_id, {"loss": 2.0, "val_hit_at_1": 0.25}, step=0)  # export_best of an untrained state: epoch 0
    tracking.log_epoch_metrics(run_id, {"loss": 1.0, "val_hit_at_1": 0.5}, step=1)
    first = tracking.log_model(run_id, model_dir)
    assert tracking.log_model(run_id, model_dir) == first  # the same epoch again (a resumed run) rewrites it
    later = tmp_path / "later"  # the same weights, described as epoch 1: a trial's improved best
    shutil.copytree(model_dir, later)
    description = json.loads((later / "seeder_model.json").read_text())
    (later / "seeder_model.json").write_text(json.dumps({**description, "epoch": 1}))
    model_id = tracking.log_model(run_id, later)
    assert model_id != first

    found = mlflow.search_logged_models(experiment_ids=[experiment_id], output_format="list")
    assert [m.model_id for m in found] == [model_id, first]  # newest first
    logged = {m.model_id: m for m in found}
    for model, step, metrics in (
        (first, 0, {("loss", 2.0), ("val_hit_at_1", 0.25)}),
        (model_id, 1, {("loss", 1.0), ("val_hit_at_1", 0.5)}),
    ):
        assert logged[model].name == "model" and logged[model].source_run_id == run_id
        assert str(logged[model].status) == "READY" and logged[model].params["model.hidden_dim"] == "8"
        assert logged[model].tags["seeder.epoch"] == str(step)
        assert {(m.key, m.value) for m in logged[model].metrics} == metrics and {m.step for m in logged[model].metrics} == {step}
    outputs = mlflow_client.get_run(run_id).outputs.model_outputs
    assert sorted((o.model_id, o.step) for o in outputs) == sorted([(first, 0), (model_id, 1)])
    assert [m.step for m in mlflow_client.get_metric_history(run_id, "loss")] == [0, 1]  # the run's history is unchanged

    assert tracking.register_model(run_id, "seeder-hand") == 1
    version = mlflow_client.get_model_version("seeder-hand", "1")
    assert version.source == f"models:/{model_id}" and version.run_id == run_id  # the newest logged model
    questions = texts[4:7]
    expected = None
    for uri_of_model in (f"runs:/{run_id}/model", f"models:/{model_id}", "models:/seeder-hand@champion"):
        # seeder's own loaders find the model directory inside the MLflow Model
        assert (tracking.download_model(uri_of_model) / "seeder_model.json").is_file()
        loaded = mlflow.pyfunc.load_model(uri_of_model)
        from_list = loaded.predict(questions, params={"k": 3})
        from_frame = loaded.predict(pd.DataFrame({"question": questions}), params={"k": 3})
        pd.testing.assert_frame_equal(from_list, from_frame)
        assert from_list["question"].tolist() == [q for q in questions for _ in range(3)]
        assert from_list["rank"].tolist() == [1, 2, 3] * 3
        expected = from_list if expected is None else expected
        pd.testing.assert_frame_equal(from_list, expected)
    # A frame's other columns are ignored, whatever their order; without a question column it is an error.
    pd.testing.assert_frame_equal(
        loaded.predict(pd.DataFrame({"id": [1, 2, 3], "question": questions}), params={"k": 3}), expected
    )
    with pytest.raises(DataError, match="needs 'question'"):
        loaded.predict(pd.DataFrame({"q": questions, "other": questions}))
