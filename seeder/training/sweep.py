"""Hyperparameter sweeps without Ray: the search space, one trial (``seeder.training.loop.fit`` with a
reporting callback), and the sweep's report (results table, plots, parameter importances).

``tune/sweep.py`` is the thin Ray Tune entry point around these pieces. The objective is the one
every training run keeps its best model by (``seeder.training.loop.selection_score``: validation Recall@20,
ties by MRR), reported after every epoch so that ASHA can stop weak trials early (paper, Appendix
D.2 sweeps hidden size, learning rate, depth and dropout).

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
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from seeder.config import PREPROCESSING_SECTIONS, ConfigError, SeederConfig, flatten, from_dict, to_dict

METRIC = "selection_score"
"""The objective of every sweep (ASHA's and Optuna's metric): ``seeder.training.loop.SELECTION_METRIC``."""
MODE = "max"

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
        hint = ", ".join(k for k in known if k.startswith(section + ".")) or ", ".join(sorted({k.split(".")[0] for k in known}))
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


def run_trial(
    config: SeederConfig,
    train_data,
    val_data,
    report: Callable[[dict[str, float], Path], None],
    resume_dir: Path | None = None,
    on_best: Callable[[Any], None] | None = None,
    artifacts: dict | None = None,
) -> dict[str, float]:
    """Train one trial with ``seeder.training.loop.fit``; after each epoch ``report(metrics, checkpoint_dir)``.

    ``checkpoint_dir`` is a training checkpoint (``seeder.policy.checkpoint``: it carries the best weights
    so far) in a temporary directory the caller may copy; ``resume_dir`` is such a directory from an
    earlier run of the same trial. ``on_best(state)`` is called when an epoch improves the objective.
    ``artifacts`` (``seeder.policy.checkpoint.artifacts_record``) is recorded in the trial's models.
    A NaN or infinite loss or metric raises ``seeder.training.loop.TrainingDiverged``. Returns the best epoch's
    metrics."""
    from seeder.policy import checkpoint  # imports torch: only on this path
    from seeder.training import loop as lib  # imports torch: only on this path

    if resume_dir is not None and checkpoint.is_checkpoint(resume_dir):
        state = lib.load_state(resume_dir)
    else:
        state = lib.build_state(config, train_data.feature_dim, lib.steps_per_epoch(train_data, config), artifacts)
    work = Path(tempfile.mkdtemp(prefix="seeder-trial-"))

    def after_epoch(state, metrics: dict[str, Any], improved: bool) -> None:
        directory = lib.save_state(state, work / f"epoch_{state.epoch:04d}")
        if improved and on_best is not None:
            on_best(state)
        report(metrics, directory)
        shutil.rmtree(directory, ignore_errors=True)

    try:
        lib.fit(state, train_data, val_data, after_epoch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return state.history[state.best_epoch - 1] if state.best_epoch else {}


def trial_params(swept: dict[str, Any]) -> dict[str, str]:
    """The swept values of a trial, as MLflow parameters (beside ``seeder.tracking.run_params``)."""
    return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in swept.items()}


# -- the sweep's report -----------------------------------------------------------------------------


def results_table(records: list[dict[str, Any]], space: dict[str, Dimension]):
    """One row per trial, best ``METRIC`` first: name, status, epochs, best metric, swept values, and
    the Ray node the trial ran on when the records say."""
    import pandas as pd  # pandas only for this table

    columns = ["trial", "status", "epochs", METRIC, *space, *(["node"] if any(r.get("node") for r in records) else [])]
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
    import matplotlib  # plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plots only

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
    import optuna  # Optuna only for the search
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # Optuna only for the search

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
    import matplotlib  # plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plots only

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
