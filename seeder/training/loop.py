"""Training the SeedER policy (paper, Algorithm 2: REINFORCE over M trajectories plus BPR): the one loop.

- ``build_state(config, feature_dim, steps_per_epoch)``: model, AdamW, warm-up + cosine schedule;
- ``train_step`` / ``train_epoch``: one minibatch / one epoch over given queries;
- ``fit(state, train_data, val_data, on_epoch)``: the epoch loop. It owns which queries each epoch
  (and each data-parallel rank) trains on, the validation sample, the finiteness checks, the best
  rule (``selection_score``), the kept model's path_end weight (``seeder.training.calibration``) and the
  metric names (``EPOCH_METRICS``, ``val_*``);
- ``save_state`` / ``load_state`` / ``export_best``: checkpoints and models (``seeder.policy.checkpoint``).

The drivers only say what happens after an epoch: ``python -m seeder.training.loop`` (``main`` below) writes
``OUT/last`` and ``OUT/model``; ``pipelines/train.py`` reports a Ray Train checkpoint and averages over
ranks; ``tune/sweep.py`` reports to Tune. Every run logs the same metrics and one model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from seeder import tracking
from seeder.config import ConfigError, SeederConfig, to_dict, training_config
from seeder.policy import checkpoint
from seeder.policy.inference import QueryData, Schedule, evaluate_per_query, mean_metrics
from seeder.policy.losses import advantages, bpr_loss, reinforce_loss
from seeder.policy.model import SeedERPolicy
from seeder.policy.rollout import QueryBatch, Rollout, recall_of_sets, score_whole_subgraph
from seeder.preprocessing.artifacts import open_artifacts
from seeder.system.io import DataError
from seeder.system.progress import Progress
from seeder.training.calibration import calibrate_path_end

EPOCH_METRICS = ("loss", "loss_reinforce", "loss_bpr", "reward", "grad_norm", "epoch_seconds", "trajectories_per_second")
"""What every driver logs per epoch, besides ``val_<metric>`` for each ``seeder.retrieve.metrics`` metric,
``val_seconds`` and ``selection_score``."""
SELECTION_METRIC = "selection_score"


class TrainingDiverged(RuntimeError):
    """A loss or validation metric became NaN or infinite."""


def selection_score(val: dict[str, float]) -> float:
    """One number per epoch for comparing runs (a sweep's objective, ASHA's stopping rule): validation
    Recall@20, ties broken by MRR. Inside a run the kept epoch is chosen by ``keeps``."""
    return val["recall_at_20"] + 1e-3 * val["mrr"]


def keeps(history: list[dict[str, Any]], kept_epoch: int, candidate: dict[str, Any], num_val: int) -> bool:
    """The best-epoch rule: does the epoch with validation metrics ``candidate`` replace the kept one?

    Recall@20 comes first, but differences within its standard error on the ``num_val`` validation
    queries, ``sqrt(p (1 - p) / n)`` at the best Recall@20 so far, are noise: among the epochs within
    it of the best, the higher MRR wins. Without this, once Recall@20 saturates (0.993-0.997 on the demo
    after two epochs) the rule picked among late epochs at random: epoch 7 at val Hit@1 0.907 against
    0.943 for epochs 11-16 of the same run. ``history`` holds the epochs before the candidate."""
    if kept_epoch <= 0:
        return True
    key = "val_recall_at_20"
    best = max([candidate[key], *(row[key] for row in history if key in row)])
    tolerance = max(math.sqrt(best * (1.0 - best) / max(num_val, 1)), 1.0 / max(num_val, 1))
    kept = history[kept_epoch - 1]
    if candidate[key] < best - tolerance:
        return False
    if kept[key] < best - tolerance:
        return True
    return candidate["val_mrr"] > kept["val_mrr"]


@dataclass
class TrainState:
    config: SeederConfig
    feature_dim: int
    model: SeedERPolicy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    steps_per_epoch: int
    epoch: int = 0  # completed epochs
    best_metric: float = -math.inf
    best_epoch: int = 0
    best_weights: dict[str, torch.Tensor] | None = None  # CPU copy of the best epoch's weights
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[str, Any] = field(default_factory=dict)  # seeder.policy.checkpoint.artifacts_record
    sample_generator: torch.Generator = field(default_factory=torch.Generator)


def check_config(config: SeederConfig) -> None:
    """Every training setting that can be wrong, checked before any work starts."""
    train = config.train
    Schedule.training(config)  # schedule and mode
    if 20 not in config.eval.ks:
        raise ConfigError(f"eval.ks={config.eval.ks} must contain 20: the best epoch is chosen by validation Recall@20")
    problems = []
    for name in ("lr", "temperature", "bpr_weight", "grad_clip", "weight_decay"):
        value = getattr(train, name)
        if (
            not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
            or (value == 0 and name in ("lr", "temperature", "grad_clip"))
        ):
            problems.append(
                f"train.{name}={value!r} must be a finite number > 0"
                + (" (or 0)" if name in ("bpr_weight", "weight_decay") else "")
            )
    for name in ("epochs", "batch_size", "num_trajectories", "eval_batch_size"):
        if int(getattr(train, name)) < 1:
            problems.append(f"train.{name}={getattr(train, name)!r} must be >= 1")
    for name in ("hidden_dim", "num_layers", "num_heads"):
        if int(getattr(config.model, name)) < 1:
            problems.append(f"model.{name}={getattr(config.model, name)!r} must be >= 1")
    if problems:
        raise ConfigError("; ".join(problems))


def lr_lambda(steps_per_epoch: int, warmup_epochs: int, epochs: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_epochs``, then cosine decay to zero at the end of ``epochs``."""
    warmup = max(1, warmup_epochs * steps_per_epoch) if warmup_epochs > 0 else 0
    total = max(1, epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_state(config: SeederConfig, feature_dim: int, steps_per_epoch: int, artifacts: dict | None = None) -> TrainState:
    """A fresh training state; ``train.init_from`` (a model directory or ``runs:/``/``models:/`` URI)
    starts from trained weights of the same architecture."""
    check_config(config)
    torch.manual_seed(config.train.seed)
    model = SeedERPolicy(feature_dim, config.model)
    if config.train.init_from:
        start, info = checkpoint.load_model(checkpoint.locate(config.train.init_from))
        if info.feature_dim != feature_dim or to_dict(info.config.model) != to_dict(config.model):
            raise ConfigError(
                f"train.init_from={config.train.init_from}: its model ({to_dict(info.config.model)}, feature dim "
                f"{info.feature_dim}) differs from this run's ({to_dict(config.model)}, {feature_dim}); "
                "use the same model.* settings"
            )
        model.load_state_dict(start.state_dict())
    # fused: one kernel for all parameter tensors (82 in the MetaQA config; CPU and CUDA) instead of
    # about ten small ops per tensor; 0.46 against 1.97 ms per step on this CPU.
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(steps_per_epoch, config.train.warmup_epochs, config.train.epochs)
    )
    return TrainState(
        config=config,
        feature_dim=feature_dim,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        steps_per_epoch=steps_per_epoch,
        artifacts=dict(artifacts or {}),
    )


def trainable_queries(data: QueryData, config: SeederConfig) -> np.ndarray:
    """Positions of the queries trained on (those with an answer inside their subgraph, by default)."""
    if not config.train.skip_unanswerable:
        return np.arange(len(data.subgraphs))
    sg = data.subgraphs
    answered = np.add.reduceat(sg.is_answer.astype(np.int64), sg.node_ptr[:-1]) if len(sg.nodes) else np.zeros(len(sg))
    answered = np.where(np.diff(sg.node_ptr) > 0, answered, 0)
    return np.flatnonzero(answered > 0)


def epoch_queries(
    pool: np.ndarray, seed: int, epoch: int, rank: int = 0, world: int = 1, queries_per_epoch: int = 0
) -> np.ndarray:
    """This rank's queries of ``epoch`` (0-based): a slice of one permutation seeded by (seed, epoch).

    The order depends on the epoch alone, so a resumed run replays the same epochs, and one worker
    trains on exactly the queries a Ray-free run would. Every rank gets the same count (the
    remainder, under ``world`` queries, sits out this epoch), so all ranks take the same number of
    optimiser steps and meet at every gradient average."""
    order = np.random.default_rng([seed, epoch]).permutation(pool)
    if queries_per_epoch:
        order = order[:queries_per_epoch]
    per_rank = len(order) // world
    return order[rank * per_rank : (rank + 1) * per_rank]


def steps_per_epoch(data: QueryData, config: SeederConfig, world: int = 1) -> int:
    n = len(trainable_queries(data, config))
    if config.train.queries_per_epoch:
        n = min(n, config.train.queries_per_epoch)
    return max(1, math.ceil((n // max(world, 1)) / config.train.batch_size))


def train_step(state: TrainState, batch: QueryBatch, relation_features: torch.Tensor) -> dict[str, float]:
    """One optimisation step on one minibatch (all trajectories as one batched graph per step)."""
    cfg = state.config.train
    model = state.model
    model.train()
    if cfg.mode == "rerank":
        scores = score_whole_subgraph(model, batch, relation_features)
        loss_rank = bpr_loss(scores, batch.valid, batch.is_answer, cfg.bpr_margin)
        loss, loss_rl, reward = loss_rank, torch.zeros(()), torch.zeros(())
    else:
        m = cfg.num_trajectories
        greedy_extra = cfg.baseline == "greedy"
        copies = m + int(greedy_extra)
        greedy = torch.zeros(batch.num_queries, copies, dtype=torch.bool, device=batch.valid.device)
        if greedy_extra:
            greedy[:, -1] = True
        rollout = Rollout(model, batch, relation_features, copies)
        out = rollout.run(cfg.expansion_sizes, cfg.frontier_caps, greedy.view(-1), cfg.temperature, state.sample_generator)
        rewards = recall_of_sets(out.selected, batch, copies).view(batch.num_queries, copies)
        log_probs = out.log_prob.view(batch.num_queries, copies)
        sampled = slice(0, m)
        adv = advantages(rewards[:, sampled], cfg.baseline, rewards[:, -1] if greedy_extra else None)
        loss_rl = reinforce_loss(log_probs[:, sampled], adv)
        sampled_rows = (~greedy.view(-1)).nonzero().squeeze(1)
        is_answer = batch.is_answer.repeat_interleave(copies, 0)
        loss_rank = bpr_loss(out.scores[sampled_rows], out.selected[sampled_rows], is_answer[sampled_rows], cfg.bpr_margin)
        loss = loss_rl + cfg.bpr_weight * loss_rank
        reward = rewards[:, sampled].mean()
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    state.optimizer.step()
    state.scheduler.step()
    return {
        "loss": float(loss.detach()),
        "loss_reinforce": float(loss_rl.detach()),
        "loss_bpr": float(loss_rank.detach()),
        "reward": float(reward),
        "grad_norm": float(grad_norm),
    }


def train_epoch(
    state: TrainState, data: QueryData, positions: np.ndarray, progress: Callable[[int, int, dict], None] | None = None
) -> dict[str, float]:
    """One epoch over the queries at ``positions`` of ``data``, in that order; the epoch's mean metrics.
    ``progress(done, total, running_means)`` is called after every minibatch."""
    cfg = state.config.train
    device = next(state.model.parameters()).device
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    data = data.on(device)
    sums: dict[str, float] = {}
    start = time.perf_counter()
    num_batches = max(1, math.ceil(len(positions) / cfg.batch_size))
    for i in range(num_batches):
        index = positions[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        if len(index) == 0:
            break
        metrics = train_step(state, data.batch(index).to(device), relation_features)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
        if progress is not None:
            progress(i + 1, num_batches, {k: v / (i + 1) for k, v in sums.items()})
    state.epoch += 1
    out = {key: value / num_batches for key, value in sums.items()}
    elapsed = time.perf_counter() - start
    out["epoch_seconds"] = elapsed
    copies = cfg.num_trajectories if cfg.mode == "seeder" else 1
    out["trajectories_per_second"] = len(positions) * copies / max(elapsed, 1e-9)
    return out


def validation_sample(val_data: QueryData, config: SeederConfig) -> QueryData:
    """The fixed, seeded sample of ``train.val_queries`` validation queries every epoch is judged on."""
    n = config.train.val_queries
    if n and len(val_data.subgraphs) > n:
        pick = np.random.default_rng(config.train.seed).choice(len(val_data.subgraphs), n, replace=False)
        return val_data.take(np.sort(pick))
    return val_data


def check_finite(metrics: dict[str, Any], epoch: int) -> None:
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise TrainingDiverged(
            f"epoch {epoch}: {', '.join(f'{k}={v}' for k, v in sorted(bad.items()))}; training diverged "
            "(lower train.lr or train.grad_clip)"
        )


EpochCallback = Callable[[TrainState, dict[str, Any], bool], None]


def fit(
    state: TrainState,
    train_data: QueryData,
    val_data: QueryData | None,
    on_epoch: EpochCallback | None = None,
    *,
    rank: int = 0,
    world: int = 1,
    average: Callable[[dict[str, float]], dict[str, float]] | None = None,
    progress: Callable[[int, int, dict], None] | None = None,
) -> TrainState:
    """Train until ``train.epochs``; after each epoch call ``on_epoch(state, metrics, improved)``.

    Data-parallel drivers pass their ``rank``/``world`` (each rank trains its slice of the epoch's
    queries) and ``average`` (the mean of a metrics dict over the ranks); only the rank given
    ``val_data`` validates and keeps the best weights. A non-finite loss or metric raises
    ``TrainingDiverged``."""
    config = state.config
    cfg = config.train
    pool = trainable_queries(train_data, config)
    if len(pool) == 0:
        raise DataError("no training query has an answer inside its bounded subgraph; check the preprocessing")
    if val_data is not None:
        val_data = validation_sample(val_data, config)
    # On a GPU the node features move there once for the run (train_epoch's own call is then a no-op).
    train_data = train_data.on(next(state.model.parameters()).device)
    while state.epoch < cfg.epochs:
        epoch = state.epoch
        positions = epoch_queries(pool, cfg.seed, epoch, rank, world, cfg.queries_per_epoch)
        # Per-(epoch, rank) random streams: ranks sample differently, and a resumed epoch replays exactly.
        state.sample_generator.manual_seed(cfg.seed * 1_000_003 + epoch * 1_009 + rank + 1)
        torch.manual_seed(cfg.seed * 7_919 + epoch * 31 + rank)
        local = train_epoch(state, train_data, positions, progress)
        seconds, rate = local.pop("epoch_seconds"), local.pop("trajectories_per_second")
        metrics: dict[str, Any] = average(local) if average is not None else dict(local)
        metrics["epoch_seconds"] = seconds
        metrics["trajectories_per_second"] = rate * world  # the ranks run side by side
        check_finite(metrics, state.epoch)
        improved = False
        if val_data is not None:
            start = time.perf_counter()
            module = getattr(state.model, "module", state.model)
            _, per_query = evaluate_per_query(module, val_data, config)
            val = mean_metrics(per_query)
            metrics.update({f"val_{k}": v for k, v in val.items()})
            metrics["val_seconds"] = time.perf_counter() - start
            metrics[SELECTION_METRIC] = selection_score(val)
            check_finite(metrics, state.epoch)
            improved = keeps(state.history, state.best_epoch, metrics, len(val_data.subgraphs))
            if improved:
                state.best_metric = metrics[SELECTION_METRIC]
                state.best_epoch = state.epoch
                state.best_weights = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
                calibration = calibrate_path_end(module, val_data, config, per_query) if cfg.calibrate_path_end else None
                if calibration is not None:
                    # The kept model ranks with the calibrated weight; training goes on with the learnt one.
                    state.best_weights["path_end_weight"] = torch.tensor(calibration.weight)
                    metrics["path_end_scale"] = calibration.scale
                    metrics.update({f"calibrated_val_{k}": v for k, v in calibration.metrics.items()})
        metrics["epoch"] = state.epoch
        state.history.append(metrics)
        if on_epoch is not None:
            on_epoch(state, metrics, improved)
    return state


def epoch_progress(state: TrainState, every_seconds: float | None = None, log: Callable[[str], None] | None = None):
    """A ``progress`` callback for ``fit``: each epoch's batches as a ``seeder.system.progress.Progress`` with
    the running loss and reward and the epoch's ETA (a bar on a terminal, else a line at most every
    ``every_seconds``)."""
    current: dict[str, Progress] = {}

    def report(done: int, total: int, means: dict[str, float]) -> None:
        if done == 1 or "bar" not in current:
            if "bar" in current:
                current["bar"].close()
            desc = f"epoch {state.epoch + 1}/{state.config.train.epochs}"
            current["bar"] = Progress(total, desc, "batch", every=every_seconds, log=log)
        bar = current["bar"]
        bar.update(1, loss=float(means.get("loss", float("nan"))), reward=float(means.get("reward", float("nan"))))
        if done == total:
            bar.close()
            del current["bar"]

    return report


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """One line per epoch: losses, reward, validation metrics, time and throughput."""
    line = (
        f"epoch {row['epoch']}/{epochs}  loss {row['loss']:.4f} (rl {row['loss_reinforce']:.4f}, "
        f"bpr {row['loss_bpr']:.4f})  reward {row['reward']:.3f}"
    )
    if "val_mrr" in row:
        line += (
            f"  val hit@1 {row['val_hit_at_1']:.3f} hit@5 {row.get('val_hit_at_5', float('nan')):.3f} "
            f"mrr {row['val_mrr']:.3f} recall@20 {row['val_recall_at_20']:.3f}"
        )
    if "path_end_scale" in row:
        line += f"  (kept; path_end weight x{row['path_end_scale']:g}: val hit@1 {row['calibrated_val_hit_at_1']:.3f})"
    line += f"  {row['epoch_seconds']:.1f}s"
    if "val_seconds" in row:
        line += f" +val {row['val_seconds']:.1f}s"
    return line + f"  {row['trajectories_per_second']:.0f} traj/s"


# -- checkpoints and models (the format lives in seeder.policy.checkpoint) -------------------------------------


def _info(state: TrainState, epoch: int, metrics: dict[str, Any]) -> checkpoint.ModelInfo:
    return checkpoint.ModelInfo(
        config=state.config,
        feature_dim=state.feature_dim,
        artifacts=state.artifacts,
        epoch=epoch,
        metrics={k: v for k, v in metrics.items() if k.startswith("val_")},
    )


def save_state(state: TrainState, directory: str | Path) -> Path:
    """A resumable checkpoint of ``state`` (current weights, optimiser, schedule, history, best weights)."""
    trainer = {
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "steps_per_epoch": state.steps_per_epoch,
        "epoch": state.epoch,
        "best_metric": state.best_metric,
        "best_epoch": state.best_epoch,
        "best_weights": state.best_weights,
        "history": state.history,
    }
    last = state.history[-1] if state.history else {}
    return checkpoint.save_training(directory, state.model, _info(state, state.epoch, last), trainer)


def load_state(directory: str | Path) -> TrainState:
    """The training state saved by ``save_state`` (resumes bit for bit on CPU)."""
    model, info, trainer = checkpoint.load_training(directory)
    state = build_state(info.config, info.feature_dim, int(trainer["steps_per_epoch"]), info.artifacts)
    state.model.load_state_dict(model.state_dict())
    state.optimizer.load_state_dict(trainer["optimizer"])
    state.scheduler.load_state_dict(trainer["scheduler"])
    state.epoch = int(trainer["epoch"])
    state.best_metric = float(trainer["best_metric"])
    state.best_epoch = int(trainer["best_epoch"])
    state.best_weights = trainer["best_weights"]
    state.history = list(trainer["history"])
    return state


def export_best(state: TrainState, directory: str | Path) -> Path:
    """The best epoch's weights as a model directory (the current ones when nothing was validated)."""
    model = SeedERPolicy(state.feature_dim, state.config.model)
    module = getattr(state.model, "module", state.model)
    model.load_state_dict(state.best_weights if state.best_weights is not None else module.state_dict())
    epoch = state.best_epoch or state.epoch
    row = state.history[epoch - 1] if 0 < epoch <= len(state.history) else {}
    return checkpoint.save_model(directory, model, _info(state, epoch, row))


# -- the Ray-free driver ------------------------------------------------------------------------------


def train_run(
    config: SeederConfig,
    train_data: QueryData,
    val_data: QueryData | None,
    out_dir: str | Path,
    *,
    resume: bool = True,
    artifacts: dict | None = None,
    log: Callable[[str], None] = print,
    on_epoch: EpochCallback | None = None,
) -> TrainState:
    """Train in this process: ``OUT/last`` after every epoch (resumed from when present) and the best
    model in ``OUT/model``."""
    if config.train.num_threads:
        torch.set_num_threads(config.train.num_threads)
    out_dir = Path(out_dir)
    last, best = out_dir / "last", out_dir / checkpoint.MODEL_DIR
    if resume and checkpoint.recover_training(last):
        log(f"put back {last} from the checkpoint a killed save had moved aside")
    if resume and checkpoint.is_checkpoint(last):
        state = load_state(last)
        log(f"resumed from {last} after epoch {state.epoch}")
    else:
        state = build_state(config, train_data.feature_dim, steps_per_epoch(train_data, config), artifacts)

    def after_epoch(state: TrainState, metrics: dict[str, Any], improved: bool) -> None:
        log(epoch_line(metrics, config.train.epochs))
        if improved or not (best / checkpoint.DESCRIPTION_FILE).is_file():
            export_best(state, best)
        save_state(state, last)
        if on_epoch is not None:
            on_epoch(state, metrics, improved)

    fit(state, train_data, val_data, after_epoch, progress=epoch_progress(state, log=log))
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seeder.training",
        description="Train the SeedER policy in this process (no Ray).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory")
    parser.add_argument("--config", help="YAML config (model/train/eval sections); default: the artifacts' own config")
    parser.add_argument("--out", required=True, help="run directory: model/ (the best model), last/ (resume), history.json")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/last (the same flag as pipelines/train.py)")
    parser.add_argument("--experiment", default="seeder-train", help="MLflow experiment; 'none' skips MLflow")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3")
    args = parser.parse_args(argv)
    try:
        artifacts = open_artifacts(args.artifacts)
        config = training_config(artifacts.config, args.config, args.overrides, artifacts.step_budget)
        check_config(config)
        out = Path(args.out)
        if not args.resume and (
            checkpoint.is_checkpoint(out / "last") or checkpoint.is_checkpoint(checkpoint.moved_aside(out / "last"))
        ):
            raise DataError(f"{out / 'last'} already holds a training run; pass --resume to continue it, or choose another --out")
        train_data = QueryData.from_artifacts(artifacts, "train")
        val_data = QueryData.from_artifacts(artifacts, "val")
        run = None
        if args.experiment != "none":
            run = tracking.TrainingRun.start(
                args.experiment,
                out.resolve().name,
                out,
                resume=args.resume,
                config=config,
                extra={"run.driver": "python -m seeder.training.loop", "run.artifacts": str(artifacts.path)},
            )
        state = train_run(
            config,
            train_data,
            val_data,
            out,
            resume=args.resume,
            artifacts=checkpoint.artifacts_record(artifacts),
            on_epoch=(lambda s, m, i: run.log_epoch(m)) if run else None,
        )
        (out / "history.json").write_text(json.dumps(state.history, indent=2))
        if run is not None:
            run.finish(out / checkpoint.MODEL_DIR, state.history)
            print(f"MLflow run {run.run_id}: model at runs:/{run.run_id}/{checkpoint.MODEL_DIR}")
    except (DataError, ConfigError) as exc:
        print(f"python -m seeder.training.loop: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
