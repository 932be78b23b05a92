"""The one place a SeedER model is saved and loaded.

A **model** is a directory::

    seeder_model.json   format, version, feature width, the resolved config, the artifacts it was
                        trained on (location and stage fingerprints), epoch and validation metrics
    weights.pt          the policy's state dict: tensors only

A **training checkpoint** (what a run resumes from) is a directory holding a model plus
``trainer.pt`` (optimiser, schedule, epoch, history, random states). Plain training, Ray Train, Tune
trials and the MLflow model (``seeder.tracking`` logs the directory as ``data/model`` of an MLflow 3
logged model) all write and read these two layouts through this module.

Loading never runs code: both ``.pt`` files are read with ``torch.load(weights_only=True)``, which
accepts tensors, numbers, strings, lists and dicts only, and the description is JSON.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seeder.config import SeederConfig, from_dict, to_dict
from seeder.features.embed import feature_space
from seeder.policy.model import SeedERPolicy
from seeder.system.io import DataError
from seeder.system.mlflow_store import download_model

FORMAT = "seeder-policy"
VERSION = 2
DESCRIPTION_FILE = "seeder_model.json"
WEIGHTS_FILE = "weights.pt"
TRAINER_FILE = "trainer.pt"
MODEL_DIR = "model"  # a checkpoint's model, and the MLflow artifact path of a run's model


@dataclass
class ModelInfo:
    """What ``seeder_model.json`` says about a model."""

    config: SeederConfig
    feature_dim: int
    # {"path": ..., "fingerprint": ..., "dataset_fingerprint": ..., "fingerprints": {stage: ...},
    #  "feature_space": ... (only for features every graph shares, seeder.features.embed.feature_space),
    #  "dataset_fingerprints": [...], "paths": [...] (a model trained on several graphs)}
    artifacts: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def locate(model: str | Path) -> Path:
    """A local model directory for a path, ``file://`` path, ``runs:/ID/model`` or ``models:/NAME@ALIAS``."""
    return download_model(str(model))


def artifacts_record(artifacts) -> dict[str, Any]:
    """Where a model's training artifacts are and what they were (their stage fingerprints), so that
    a model can be loaded with nothing else and a mismatched graph is noticed."""
    if artifacts is None:
        return {}
    # Absolute, so that the model loads from any working directory (an MLflow server's, a Ray worker's).
    record = {"path": str(Path(artifacts.path).resolve()), "fingerprints": dict(artifacts.manifest.get("fingerprints", {}))}
    if getattr(artifacts, "fingerprint", None):
        record["fingerprint"] = artifacts.fingerprint
    if artifacts.manifest.get("dataset_fingerprint"):
        record["dataset_fingerprint"] = artifacts.manifest["dataset_fingerprint"]
    space = artifact_feature_space(artifacts)
    if space:
        record["feature_space"] = space
    return record


def graphs_record(every: list, locations: list[str]) -> dict[str, Any]:
    """``artifacts_record`` of a model trained on the artifacts ``every`` (one per graph), found at
    ``locations`` as the run was given them (a URI stays one); with several, the graphs it knows, so that
    on none of them it counts as zero-shot (``seeder.serving.retriever.check_compatible``)."""
    record = artifacts_record(every[0]) | {"path": locations[0]}
    if len(every) > 1:
        record["dataset_fingerprints"] = [a.manifest.get("dataset_fingerprint") for a in every]
        record["paths"] = list(locations)
    return record


def artifact_feature_space(artifacts) -> str | None:
    """``seeder.features.embed.feature_space`` of the artifacts' config (None without one)."""
    config = getattr(artifacts, "config", None) if artifacts.manifest.get("config") else None
    return feature_space(config) if config is not None else None


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_model(directory: str | Path, model: torch.nn.Module, info: ModelInfo) -> Path:
    """Write ``model``'s weights and ``info`` into ``directory`` (created; files replaced atomically)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    module = getattr(model, "module", model)  # a DDP wrapper's inner module
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    _write_atomic(directory / WEIGHTS_FILE, lambda p: torch.save(state, p))
    description = {
        "format": FORMAT,
        "version": VERSION,
        "feature_dim": int(info.feature_dim),
        "config": to_dict(info.config),
        "artifacts": info.artifacts,
        "epoch": int(info.epoch),
        "metrics": {k: float(v) for k, v in info.metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)},
    }
    _write_atomic(directory / DESCRIPTION_FILE, lambda p: p.write_text(json.dumps(description, indent=2)))
    return directory


def _safe_load(path: Path, what: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, foreign, or a pickle that wants to run code
        raise DataError(
            f"{path}: cannot be read as {what} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "retrain, or pick a model directory written by seeder"
        ) from exc


def read_info(directory: str | Path) -> ModelInfo:
    """The description of the model in ``directory`` (a clear error for anything else)."""
    directory = Path(directory)
    path = directory / DESCRIPTION_FILE
    if not path.is_file():
        hint = " (an old best.pt checkpoint: retrain to get a model directory)" if directory.suffix == ".pt" else ""
        raise DataError(
            f"model {directory}: no {DESCRIPTION_FILE} there{hint}; pass a model directory written by "
            "training (RUN/model), runs:/ID/model or models:/NAME@ALIAS"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc}); the model directory is damaged, retrain it") from exc
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise DataError(
            f"{path}: format {raw.get('format')!r} version {raw.get('version')!r}, expected {FORMAT!r} "
            f"version {VERSION}; retrain with this version of seeder"
        )
    return ModelInfo(
        config=from_dict(SeederConfig, raw["config"]),
        feature_dim=int(raw["feature_dim"]),
        artifacts=raw.get("artifacts") or {},
        epoch=int(raw.get("epoch", 0)),
        metrics=raw.get("metrics") or {},
    )


def load_model(directory: str | Path) -> tuple[SeedERPolicy, ModelInfo]:
    """The policy (eval mode, CPU) and its description, from a local model directory."""
    directory = Path(directory)
    info = read_info(directory)
    state = _safe_load(directory / WEIGHTS_FILE, "SeedER weights")
    model = SeedERPolicy(info.feature_dim, info.config.model)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise DataError(
            f"{directory / WEIGHTS_FILE}: weights do not fit the model its description names "
            f"({str(exc).splitlines()[0][:200]}); retrain"
        ) from exc
    model.eval()
    return model, info


# -- training checkpoints ------------------------------------------------------------------------


def moved_aside(directory: str | Path) -> Path:
    """Where ``save_training`` keeps the previous checkpoint between its two renames (``.NAME.old``)."""
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.old")


def save_training(directory: str | Path, model: torch.nn.Module, info: ModelInfo, trainer: dict[str, Any]) -> Path:
    """A resumable checkpoint: ``directory/model`` plus ``directory/trainer.pt``. Written into a
    sibling temporary directory and renamed, so a crash never leaves a half checkpoint in place."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        save_model(staging / MODEL_DIR, model, info)
        torch.save(trainer, staging / TRAINER_FILE)
        if directory.exists():
            old = moved_aside(directory)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(directory, old)
            os.replace(staging, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def recover_training(directory: str | Path) -> bool:
    """Finish what a ``save_training`` killed between its two renames left: ``directory`` gone and the
    previous checkpoint at ``.NAME.old``, which is put back (the epoch after it is trained again). Stale
    staging directories of killed saves are removed. True when a checkpoint was put back."""
    directory = Path(directory)
    restored = False
    old = moved_aside(directory)
    if not directory.exists() and is_checkpoint(old):
        os.replace(old, directory)
        restored = True
    if directory.parent.is_dir():
        for stale in directory.parent.glob(f".{directory.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    return restored


def load_training(directory: str | Path) -> tuple[SeedERPolicy, ModelInfo, dict[str, Any]]:
    directory = Path(directory)
    recover_training(directory)
    if not (directory / TRAINER_FILE).is_file():
        raise DataError(
            f"{directory}: no {TRAINER_FILE}; not a training checkpoint (start without resuming, or "
            "pass the run's last/ directory)"
        )
    model, info = load_model(directory / MODEL_DIR)
    return model, info, _safe_load(directory / TRAINER_FILE, "a SeedER training state")


def is_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a complete training checkpoint (see ``recover_training`` for one that a
    kill inside ``save_training`` moved aside)."""
    return (Path(directory) / TRAINER_FILE).is_file() and (Path(directory) / MODEL_DIR / DESCRIPTION_FILE).is_file()
