"""Hyperparameter sweeps without Ray: the search space, one trial's training loop, its MLflow child
run, and the sweep's report (results table, plots, parameter importances).

``tune/sweep.py`` is the thin Ray Tune entry point around these pieces. The objective is declared
once, here (``METRIC``/``MODE``): validation Recall@20, reported after every epoch so that ASHA can
stop weak trials early (paper, Appendix D.2 sweeps hidden size, learning rate, depth and dropout).

A space file is YAML mapping dotted config keys to one of::

    model.hidden_dim: [16, 32, 64]              # a categorical choice (lists of lists are fine)
    train.bpr_weight: {uniform: [0.1, 2.0]}     # continuous
    train.lr: {loguniform: [1.0e-4, 1.0e-2]}
    train.num_trajectories: {int: [4, 16]}      # integers, both ends included
    model.dropout: null                         # drop a dimension of the default space

Keys of the preprocessing sections (embed, reduce, seed, expand) are refused: the bounded subgraphs
were built with them, so sweeping them means building one artifacts directory per value.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from seeder.config import PREPROCESSING_SECTIONS, ConfigError, SeederConfig, flatten, from_dict, to_dict

METRIC = "val_recall_at_20"
"""The objective of every sweep: validation Recall@20 after each epoch (ASHA's and Optuna's metric)."""
MODE = "max"

MODEL_ARTIFACT = "model"  # same directory name as seeder.tracking.MODEL_ARTIFACT
CHECKPOINT_FILE = "checkpoint.pt"  # inside the model artifact, next to config.yaml
KINDS = ("choice", "uniform", "loguniform", "int")

DEFAULT_SPACE_YAML = """
model.hidden_dim: [16, 32, 64]
train.lr: [1.0e-2, 1.0e-3, 3.0e-4, 1.0e-4]
model.num_layers: [2, 3, 4, 6]
model.dropout: [0.1, 0.3, 0.5]
"""

# Short names for trial names such as t003-h32-l3-lr1e-3.
ABBREVIATIONS = {
    "model.hidden_dim": "h",
    "model.num_layers": "l",
    "train.lr": "lr",
    "model.dropout": "d",
    "model.num_heads": "nh",
    "train.bpr_weight": "bpr",
    "train.num_trajectories": "m",
    "train.temperature": "tau",
    "train.expansion_sizes": "c",
    "train.frontier_caps": "f",
    "train.batch_size": "b",
    "train.weight_decay": "wd",
}


class TrialDiverged(RuntimeError):
    """A trial whose loss or validation metric became NaN or infinite."""


@dataclass(frozen=True)
class Dimension:
    """One swept config key: a categorical ``choice`` over ``values`` or a range ``low..high``.

    Choices that are lists (e.g. ``train.expansion_sizes``) are held as JSON strings, because
    Optuna's categorical distributions accept only scalars; ``apply_params`` decodes them.
    """

    key: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None


def _encode(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _check_value(key: str, value: Any, where: str) -> None:
    try:
        apply_params(SeederConfig(), {key: _encode(value)})
    except ConfigError as exc:
        raise ConfigError(f"{where}: value {value!r} of {key} does not fit the config ({exc})") from None


def _dimension(key: str, spec: Any, where: str) -> Dimension:
    known = flatten(SeederConfig())
    if key not in known:
        section = key.split(".")[0]
        hint = ", ".join(k for k in known if k.startswith(section + ".")) or ", ".join(sorted({k.split('.')[0] for k in known}))
        raise ConfigError(f"{where}: unknown config key {key!r}; keys there: {hint}")
    if key.split(".")[0] in PREPROCESSING_SECTIONS:
        raise ConfigError(
            f"{where}: {key} is a preprocessing key: the artifacts' subgraphs were built with one value of it. "
            "Build one artifacts directory per value (pipelines/preprocess.py) and sweep each"
        )
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: {key} has an empty list of choices")
        for value in spec:
            _check_value(key, value, where)
        return Dimension(key, "choice", values=tuple(_encode(v) for v in spec))
    if isinstance(spec, dict) and len(spec) == 1:
        ((kind, bounds),) = spec.items()
        if kind == "choice":
            return _dimension(key, bounds, where)
        if kind not in KINDS or not (isinstance(bounds, list) and len(bounds) == 2):
            raise ConfigError(
                f"{where}: {key}: {spec!r} is not a space entry; write a list of choices or one of "
                "{uniform: [low, high]}, {loguniform: [low, high]}, {int: [low, high]}"
            )
        try:
            low, high = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {key}: bounds {bounds!r} must be numbers") from None
        if not low < high or (kind == "loguniform" and low <= 0):
            raise ConfigError(f"{where}: {key}: need low < high (and low > 0 for loguniform), got {bounds!r}")
        if kind == "int":
            low, high = int(low), int(high)
        for value in (low, high):
            _check_value(key, value, where)
        return Dimension(key, kind, low=low, high=high)
    raise ConfigError(
        f"{where}: {key}: {spec!r} is not a space entry; write a list of choices or "
        "{uniform|loguniform|int: [low, high]}, or null to drop a default dimension"
    )


def parse_space(text: str, where: str = "search space") -> dict[str, Dimension]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must map dotted config keys to choices, got {type(data).__name__}")
    return {str(k): (None if v is None else _dimension(str(k), v, where)) for k, v in data.items()}


def default_space() -> dict[str, Dimension]:
    """The paper's space: hidden {16,32,64}, lr {1e-2,1e-3,3e-4,1e-4}, layers {2,3,4,6}, dropout {0.1,0.3,0.5}."""
    return parse_space(DEFAULT_SPACE_YAML, "default space")


def load_space(path: str | Path | None = None) -> dict[str, Dimension]:
    """The default space, extended (or narrowed: ``key: null``) by the YAML file at ``path``."""
    space = default_space()
    if path is None:
        return space
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"space file {path} does not exist; see configs/sweep_space_extended.yaml")
    for key, dim in parse_space(path.read_text(), f"space file {path}").items():
        if dim is None:
            space.pop(key, None)
        else:
            space[key] = dim
    if not space:
        raise ConfigError(f"space file {path} leaves no dimension to sweep")
    return space


def apply_params(base: SeederConfig, params: dict[str, Any]) -> SeederConfig:
    """``base`` with dotted ``params`` set (JSON-encoded list choices decoded); schema-checked."""
    data = to_dict(base)
    for key, value in params.items():
        section, _, name = key.partition(".")
        if section not in data or not isinstance(data[section], dict) or name not in data[section]:
            raise ConfigError(f"unknown config key {key!r} in the trial's parameters")
        if isinstance(value, str) and isinstance(data[section][name], list):
            value = json.loads(value)
        if isinstance(value, np.generic):
            value = value.item()
        data[section][name] = value
    return from_dict(SeederConfig, data)


# -- trial names --------------------------------------------------------------------------------------


def format_value(value: Any) -> str:
    """Compact, filesystem-safe: 1e-3, 3e-4, 0.3, 32, [7, 10] -> 7x10."""
    if isinstance(value, str) and value.startswith("["):
        value = json.loads(value)
    if isinstance(value, (list, tuple)):
        return "x".join(format_value(v) for v in value)
    if isinstance(value, (bool, np.bool_)):
        return "y" if value else "n"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4):
            mantissa, exponent = f"{value:.2e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{value:.3g}"
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in str(value))


def abbreviation(key: str) -> str:
    if key in ABBREVIATIONS:
        return ABBREVIATIONS[key]
    return "".join(word[0] for word in key.split(".")[-1].split("_"))


def trial_name(index: int, params: dict[str, Any]) -> str:
    """``t003-h32-l3-lr1e-3-d0.1``: the trial's number, then each swept value after its short name."""
    parts = [f"t{index:03d}"] + [f"{abbreviation(k)}{format_value(v)}" for k, v in params.items()]
    return "-".join(parts)[:100]


# -- one trial -----------------------------------------------------------------------------------------


def check_finite(metrics: dict[str, float], epoch: int) -> None:
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise TrialDiverged(
            f"epoch {epoch}: {', '.join(f'{k}={v}' for k, v in sorted(bad.items()))}; the trial diverged "
            "(lower train.lr or train.grad_clip)"
        )


def run_trial(
    config: SeederConfig,
    train_data,
    val_data,
    report: Callable[[dict[str, float], Path], None],
    resume_dir: Path | None = None,
    on_best: Callable[[Path, SeederConfig], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Train one trial epoch by epoch; after each, ``report(metrics, checkpoint_dir)``.

    ``checkpoint_dir`` holds ``last.pt`` (to resume exactly) and ``best.pt`` (the best epoch by
    ``METRIC`` so far); it is a fresh temporary directory the caller may copy. ``resume_dir`` is such
    a directory from an earlier run of the same trial. ``on_best(best_pt, config)`` is called when an
    epoch improves ``METRIC``. A NaN or infinite loss or metric raises ``TrialDiverged``.
    Returns the best epoch's metrics.
    """
    from seeder.train import build_state, evaluate, load_checkpoint, save_checkpoint, steps_per_epoch, train_epoch

    if resume_dir is not None and (Path(resume_dir) / "last.pt").is_file():
        state = load_checkpoint(Path(resume_dir) / "last.pt")
        best_source = Path(resume_dir) / "best.pt"
    else:
        state = build_state(config, train_data.feature_dim, steps_per_epoch(train_data, config))
        best_source = None
    if config.train.val_queries and len(val_data.subgraphs) > config.train.val_queries:
        pick = np.random.default_rng(config.train.seed).choice(len(val_data.subgraphs), config.train.val_queries, replace=False)
        val_data = val_data.take(np.sort(pick))
    work = Path(tempfile.mkdtemp(prefix="seeder-trial-"))
    best_path = work / "best.pt"
    if best_source is not None and best_source.is_file():
        shutil.copy2(best_source, best_path)
    best_metrics = max(state.history, key=lambda m: m.get(METRIC, -math.inf), default={})
    try:
        while state.epoch < config.train.epochs:
            metrics = train_epoch(state, train_data)
            check_finite(metrics, state.epoch)
            start = time.perf_counter()
            _, val = evaluate(state.model, val_data, state.config)
            metrics.update({f"val_{k}": v for k, v in val.items()})
            metrics["val_seconds"] = time.perf_counter() - start
            check_finite(metrics, state.epoch)
            metrics["epoch"] = state.epoch
            state.history.append(metrics)
            if log:
                log(f"epoch {state.epoch}: loss {metrics['loss']:.4f} {METRIC} {metrics[METRIC]:.4f}")
            improved = metrics[METRIC] > state.best_metric
            if improved:
                state.best_metric = metrics[METRIC]
                best_metrics = metrics
                save_checkpoint(state, best_path)
            checkpoint_dir = Path(tempfile.mkdtemp(prefix="ckpt-", dir=work))
            save_checkpoint(state, checkpoint_dir / "last.pt")
            shutil.copy2(best_path, checkpoint_dir / "best.pt")
            if improved and on_best is not None:
                on_best(best_path, state.config)
            report(metrics, checkpoint_dir)
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return best_metrics


# -- MLflow child runs ------------------------------------------------------------------------------


def _param_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def trial_params(config: SeederConfig, swept: dict[str, Any]) -> dict[str, str]:
    """What a child run records: every model.* and train.* value, then the swept keys."""
    flat = {k: v for k, v in flatten(config).items() if k.split(".")[0] in ("model", "train")}
    flat.update(swept)
    return {k: _param_value(v) for k, v in flat.items()}


class TrialRun:
    """The MLflow child run of one trial (tag ``mlflow.parentRunId``), reopened when the trial resumes.

    Uses ``MlflowClient`` only (no global active run), so concurrent trials in one process and the
    sweep driver do not step on each other.
    """

    def __init__(self, tracking_uri: str, experiment_id: str, parent_run_id: str, name: str, params: dict[str, str]):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
        found = find_child_runs(self.client, experiment_id, parent_run_id, name)
        self.logged_epochs: set[int] = set()
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            # A trial interrupted between logging an epoch and Tune saving its checkpoint redoes that
            # epoch on resume; the run keeps the first record of each epoch.
            self.logged_epochs = {m.step for m in self.client.get_metric_history(self.run_id, METRIC)}
        else:
            run = self.client.create_run(
                experiment_id,
                run_name=name,
                tags={"mlflow.parentRunId": parent_run_id, "seeder.trial": name, "seeder.kind": "trial"},
            )
            self.run_id = run.info.run_id
            from mlflow.entities import Param

            items = [Param(k, v[:6000]) for k, v in params.items()]
            for lo in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[lo : lo + 100])

    def log_epoch(self, metrics: dict[str, float], epoch: int) -> None:
        from mlflow.entities import Metric

        if epoch in self.logged_epochs:
            return
        self.logged_epochs.add(epoch)
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, epoch) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "epoch"]
        self.client.log_batch(self.run_id, metrics=items)

    def log_best(self, best_pt: Path, config: SeederConfig) -> None:
        """The best checkpoint so far as the run's ``model/`` artifact (checkpoint.pt + config.yaml)."""
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / MODEL_ARTIFACT
            target.mkdir()
            shutil.copy2(best_pt, target / CHECKPOINT_FILE)
            (target / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
            self.client.log_artifacts(self.run_id, str(target), MODEL_ARTIFACT)

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        if error:
            self.client.set_tag(self.run_id, "seeder.error", error[:4000])
        self.client.set_terminated(self.run_id, status=status)


def find_child_runs(client, experiment_id: str, parent_run_id: str, name: str | None = None) -> list:
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
    if name is not None:
        query += f" and tags.`seeder.trial` = '{name}'"
    return client.search_runs([experiment_id], filter_string=query, max_results=10_000)


# -- the sweep's report -----------------------------------------------------------------------------


def results_table(records: list[dict[str, Any]], space: dict[str, Dimension]):
    """One row per trial, best ``METRIC`` first: name, status, epochs, best metric, swept values."""
    import pandas as pd

    columns = ["trial", "status", "epochs", METRIC, *space]
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in records], columns=columns)
    for key in space:
        frame[key] = frame[key].map(lambda v: format_value(v) if isinstance(v, str) and v.startswith("[") else v)
    return frame.sort_values(METRIC, ascending=MODE == "min", na_position="last").reset_index(drop=True)


def to_markdown(frame) -> str:
    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def _completed(frame):
    return frame[frame[METRIC].notna() & (frame["status"] != "FAILED")]


def plot_metric_vs_params(frame, space: dict[str, Dimension], path: Path) -> Path:
    """One panel per swept key: each trial's best ``METRIC`` against its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = _completed(frame)
    cols = min(3, len(space))
    rows = math.ceil(len(space) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (key, dim) in zip(axes.flat, space.items()):
        if dim.kind == "choice":
            labels = [format_value(v) for v in dim.values]
            position = {label: i for i, label in enumerate(labels)}
            x = [position.get(format_value(v), np.nan) for v in done[key]]
            ax.set_xticks(range(len(labels)), labels)
        else:
            x = done[key].astype(float).to_numpy()
            if dim.kind == "loguniform":
                ax.set_xscale("log")
        ax.scatter(x, done[METRIC].astype(float), alpha=0.8)
        ax.set_xlabel(key)
        ax.set_ylabel(METRIC)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(space) :]:
        ax.axis("off")
    fig.suptitle(f"{METRIC} of {len(done)} trials against each hyperparameter")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def param_importances(frame, space: dict[str, Dimension]) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) on a study rebuilt from the completed trials; empty
    when fewer than two trials completed or their metric never varied."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    done = _completed(frame)
    if len(done) < 2 or done[METRIC].astype(float).nunique() < 2:
        return {}
    distributions = {}
    for key, dim in space.items():
        if dim.kind == "choice":
            distributions[key] = CategoricalDistribution([format_value(v) for v in dim.values])
        elif dim.kind == "int":
            distributions[key] = IntDistribution(int(dim.low), int(dim.high))
        else:
            distributions[key] = FloatDistribution(dim.low, dim.high, log=dim.kind == "loguniform")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if MODE == "max" else "minimize")
    for row in done.to_dict("records"):
        params = {}
        for key, dim in space.items():
            value = row[key]
            params[key] = format_value(value) if dim.kind == "choice" else (int(value) if dim.kind == "int" else float(value))
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=float(row[METRIC])))
    return dict(optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)))


def plot_importances(importances: dict[str, float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.5 * max(2, len(importances)) + 1))
    keys = list(importances)[::-1]
    ax.barh(keys, [importances[k] for k in keys])
    ax.set_xlabel(f"importance for {METRIC} (fANOVA)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(records: list[dict[str, Any]], space: dict[str, Dimension], out_dir: Path) -> dict[str, Any]:
    """results.csv, results.md, metric_vs_params.png and param_importances.{json,png} in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = results_table(records, space)
    frame.to_csv(out_dir / "results.csv", index=False)
    (out_dir / "results.md").write_text(to_markdown(frame))
    plot_metric_vs_params(frame, space, out_dir / "metric_vs_params.png")
    importances = param_importances(frame, space)
    (out_dir / "param_importances.json").write_text(json.dumps(importances, indent=2))
    if importances:
        plot_importances(importances, out_dir / "param_importances.png")
    return {"table": frame, "importances": importances}
