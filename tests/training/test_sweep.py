"""The Ray-free pieces of sweeps: space parsing, trial names, one trial, child runs, the report."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from seeder.config import ConfigError, SeederConfig, load_config
from seeder.policy.toy import toy_task
from seeder.training import sweep as sw
from seeder.training.loop import TrainingDiverged, load_state

REPO = Path(__file__).resolve().parents[2]


def test_default_space_is_the_papers():
    space = sw.default_space()
    assert space["model.hidden_dim"].values == (16, 32, 64)
    assert space["train.lr"].values == (1e-2, 1e-3, 3e-4, 1e-4)
    assert space["model.num_layers"].values == (2, 3, 4, 6)
    assert space["model.dropout"].values == (0.1, 0.3, 0.5)
    assert all(d.kind == "choice" for d in space.values())


def test_extended_example_space_parses_and_every_choice_builds_a_config():
    space = sw.load_space(REPO / "configs" / "sweep_space_extended.yaml")
    assert set(sw.default_space()) < set(space)
    assert space["train.bpr_weight"].kind == "uniform" and space["train.bpr_weight"].low == 0.25
    assert space["train.temperature"].kind == "loguniform"
    sizes = space["train.expansion_sizes"]
    assert sizes.values == ("[5, 5]", "[7, 10]", "[10, 15]")  # JSON strings: Optuna needs scalars
    config = sw.apply_params(SeederConfig(), {"train.expansion_sizes": sizes.values[2], "model.hidden_dim": 64})
    assert config.train.expansion_sizes == [10, 15] and config.model.hidden_dim == 64


def test_space_file_drops_and_ranges(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("model.dropout: null\ntrain.num_trajectories: {int: [2, 6]}\n")
    space = sw.load_space(path)
    assert "model.dropout" not in space
    assert (space["train.num_trajectories"].kind, space["train.num_trajectories"].low, space["train.num_trajectories"].high) == (
        "int",
        2,
        6,
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model.hidden: [1, 2]", "unknown config key 'model.hidden'"),
        ("expand.budget: [100, 200]", "preprocessing key"),
        ("model.hidden_dim: ['wide']", "does not fit the config"),
        ("train.lr: {loguniform: [0, 1]}", "low > 0"),
        ("train.lr: {gaussian: [0, 1]}", "not a space entry"),
        ("train.lr: []", "empty list"),
        ("[1, 2]", "must map dotted config keys"),
    ],
)
def test_bad_space_files_name_the_file_and_key(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        sw.load_space(path)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


def test_missing_space_file():
    with pytest.raises(ConfigError, match="does not exist"):
        sw.load_space("/nonexistent/space.yaml")


def test_trial_names_are_short_and_readable():
    name = sw.trial_name(3, {"model.hidden_dim": 32, "model.num_layers": 3, "train.lr": 1e-3, "model.dropout": 0.1})
    assert name == "t003-h32-l3-lr1e-3-d0.1"
    assert sw.trial_name(12, {"train.lr": 3e-4, "train.expansion_sizes": "[7, 10]"}) == "t012-lr3e-4-c7x10"
    assert sw.trial_name(1, {"train.bpr_margin": 0.5, "train.skip_unanswerable": True}) == "t001-bm0.5-suy"
    assert sw.format_value(0.012345) == "0.0123"


def test_apply_params_rejects_unknown_keys_and_bad_types():
    with pytest.raises(ConfigError, match="unknown config key"):
        sw.apply_params(SeederConfig(), {"model.width": 3})
    with pytest.raises(ConfigError, match="model.hidden_dim"):
        sw.apply_params(SeederConfig(), {"model.hidden_dim": "wide"})
    config = sw.apply_params(SeederConfig(), {"model.num_layers": np.int64(4)})
    assert config.model.num_layers == 4 and type(config.model.num_layers) is int


def tiny_config(**train) -> SeederConfig:
    overrides = [
        "model.hidden_dim=8",
        "model.num_layers=1",
        "train.batch_size=8",
        "train.num_trajectories=2",
        "train.epochs=3",
        "train.warmup_epochs=0",
        "train.expansion_sizes=[3,3]",
        "train.frontier_caps=[6,8]",
    ]
    overrides += [f"train.{k}={v}" for k, v in train.items()]
    return load_config(None, overrides)


def test_run_trial_reports_every_epoch_and_resumes_from_its_checkpoint(tmp_path):
    data = toy_task(num_queries=24, nodes_per_query=16, dim=8)
    config = tiny_config()
    seen, saved, bests = [], [], []

    def report(metrics, checkpoint_dir):
        seen.append(metrics)
        # The caller copies the directory (as Ray does) before the next epoch replaces it.
        saved.append(Path(shutil.copytree(checkpoint_dir, tmp_path / f"epoch{metrics['epoch']}")))

    best = sw.run_trial(config, data, data, report, on_best=lambda state: bests.append(state.epoch))
    assert [m["epoch"] for m in seen] == [1, 2, 3]
    assert all(sw.METRIC in m and 0.0 <= m[sw.METRIC] <= 1.001 for m in seen)  # recall@20 + 1e-3 mrr
    assert best == seen[best["epoch"] - 1]  # the kept epoch's metrics (seeder.training.loop.keeps)
    assert bests[0] == 1 and bests[-1] == best["epoch"]
    assert load_state(saved[-1]).best_metric == best[sw.METRIC]
    # Resuming after epoch 1 trains only epochs 2 and 3 and lands on the same weights (CPU is deterministic).
    resumed = []
    sw.run_trial(config, data, data, lambda m, d: resumed.append((m, load_state(d))), resume_dir=saved[0])
    assert [m["epoch"] for m, _ in resumed] == [2, 3]
    final_a = load_state(saved[-1]).model.state_dict()
    final_b = resumed[-1][1].model.state_dict()
    assert all(np.allclose(final_a[k].numpy(), final_b[k].numpy()) for k in final_a)


def test_run_trial_raises_when_the_loss_turns_nan(monkeypatch):
    import seeder.training.loop as train

    data = toy_task(num_queries=16, nodes_per_query=16, dim=8)
    real = train.train_epoch

    def nan_epoch(state, data_, positions, progress=None):
        out = real(state, data_, positions)
        out["loss"] = math.nan
        return out

    monkeypatch.setattr(train, "train_epoch", nan_epoch)
    with pytest.raises(TrainingDiverged, match="epoch 1: loss=nan"):
        sw.run_trial(tiny_config(), data, data, lambda m, d: None)


def records(n_failed: int = 1):
    rows = []
    for i, (h, lr, value) in enumerate([(16, 1e-2, 0.2), (32, 1e-3, 0.5), (64, 1e-3, 0.55), (32, 1e-4, 0.3), (16, 3e-4, 0.25)]):
        rows.append(
            {"trial": f"t{i:03d}", "status": "FINISHED", "epochs": 3, sw.METRIC: value, "model.hidden_dim": h, "train.lr": lr}
        )
    rows += [
        {"trial": f"t9{i}", "status": "FAILED", "epochs": 0, sw.METRIC: None, "model.hidden_dim": 16, "train.lr": 1e-2}
        for i in range(n_failed)
    ]
    return rows


def test_report_table_plots_and_importances(tmp_path):
    space = {k: v for k, v in sw.default_space().items() if k in ("model.hidden_dim", "train.lr")}
    out = sw.write_report(records(), space, tmp_path)
    table = out["table"]
    assert list(table["trial"][:3]) == ["t002", "t001", "t003"]  # best first
    assert table["status"].iloc[-1] == "FAILED"
    csv = (tmp_path / "results.csv").read_text().splitlines()
    assert csv[0].startswith("trial,status,epochs,selection_score") and len(csv) == 7
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[0].startswith("| trial | status") and md[2].startswith("| t002 | FINISHED | 3 | 0.55 | 64 |")
    assert (tmp_path / "metric_vs_params.png").stat().st_size > 5_000
    importances = json.loads((tmp_path / "param_importances.json").read_text())
    assert set(importances) == {"model.hidden_dim", "train.lr"}
    assert math.isclose(sum(importances.values()), 1.0, rel_tol=1e-6)
    assert (tmp_path / "param_importances.png").is_file()


def test_importances_need_two_differing_trials():
    space = sw.default_space()
    rows = records()[:1]
    assert sw.param_importances(sw.results_table(rows, space), space) == {}


def test_trial_child_runs_in_sqlite(tmp_path):
    from mlflow import MlflowClient

    from seeder import tracking
    from seeder.training.loop import build_state, export_best

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    config = tiny_config()
    run = tracking.TrainingRun.child(uri, experiment, parent, "t000-h8", config, sw.trial_params({"model.hidden_dim": 8}))
    run.log_epoch({"loss": 1.0, sw.METRIC: 0.2, "epoch": 1})
    run.log_epoch({"loss": 0.5, sw.METRIC: 0.4, "epoch": 2})
    run.log_model(export_best(build_state(config, 8, 1), tmp_path / "model"))
    # A resumed trial reopens the same child run instead of creating a second one.
    again = tracking.TrainingRun.child(uri, experiment, parent, "t000-h8", config, {})
    assert again.run_id == run.run_id
    again.log_epoch({"loss": 9.0, sw.METRIC: 0.9, "epoch": 2})  # an epoch redone after a resume keeps its first record
    again.fail("TrainingDiverged: loss=nan")
    got = client.get_run(run.run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["mlflow.parentRunId"] == parent and got.data.tags["seeder.error"].startswith("TrainingDiverged")
    assert got.data.params["model.hidden_dim"] == "8" and got.data.params["train.expansion_sizes"] == "[3, 3]"
    assert not any(k.startswith(("synth.", "baselines.")) for k in got.data.params)
    history = client.get_metric_history(run.run_id, sw.METRIC)
    assert [(m.step, m.value) for m in history] == [(1, 0.2), (2, 0.4)]
    logged = tracking.logged_model_of(client, run.run_id)  # the model is an MLflow 3 logged model of the run
    files = {f.path for f in client.list_logged_model_artifacts(logged.model_id)} | {
        f.path for f in client.list_logged_model_artifacts(logged.model_id, "data/model")
    }
    assert {"MLmodel", "data/model/seeder_model.json", "data/model/weights.pt"} <= files
    assert len(tracking.find_child_runs(client, experiment, parent)) == 1
