"""Ray-free training of the SeedER policy: one epoch, one evaluation, checkpoints, and a driver.

The library API (what ``pipelines/train.py`` and the Tune trainable wrap):

- ``TrainingData.from_artifacts(artifacts, split)``: features + bounded subgraphs of one split;
- ``build_state(config, feature_dim, steps_per_epoch)``: model, AdamW, warm-up + cosine schedule, RNGs;
- ``train_epoch(state, data)``: one epoch of REINFORCE + BPR (Algorithm 2), returns mean metrics;
- ``evaluate(model, data, config)``: greedy rollouts (Algorithm 1) -> RetrievalResult + metrics;
- ``save_checkpoint`` / ``load_checkpoint`` / ``load_model``: everything needed to resume exactly.

``fit`` strings them together (``python -m seeder.train --artifacts A --out RUN``), keeping
``last.pt`` after every epoch and ``best.pt`` by validation recall_at_20.
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

from seeder.config import ConfigError, SeederConfig, from_dict, to_dict, training_config
from seeder.io import DataError
from seeder.losses import advantages, bpr_loss, reinforce_loss
from seeder.model import SeedERPolicy
from seeder.retrieve.base import RetrievalResult
from seeder.rollout import (
    QueryBatch,
    Rollout,
    make_query_batch,
    rank_nodes,
    recall_of_sets,
    score_whole_subgraph,
)
from seeder.subgraphs import SubgraphSet

CHECKPOINT_VERSION = 1


@dataclass
class TrainingData:
    """What training and evaluation read: features by row and one split's bounded subgraphs."""

    node_features: np.ndarray  # [N, d], may be a memmap
    relation_features: np.ndarray  # [2R, d]
    query_features: np.ndarray  # [Q, d], rows aligned with ``subgraphs``
    subgraphs: SubgraphSet

    def __post_init__(self) -> None:
        if len(self.query_features) != len(self.subgraphs):
            raise DataError(
                f"{len(self.query_features)} query feature rows for {len(self.subgraphs)} subgraphs; "
                "pass the rows of the subgraphs' query ids, in order"
            )
        if self.relation_features.shape[0] % 2:
            raise DataError(f"relation features have {self.relation_features.shape[0]} rows; expected 2R")

    @property
    def feature_dim(self) -> int:
        return int(self.node_features.shape[1])

    @property
    def num_relations(self) -> int:
        return self.relation_features.shape[0] // 2

    @classmethod
    def from_artifacts(cls, artifacts, split: str) -> "TrainingData":
        subgraphs = artifacts.subgraphs(split)
        if len(subgraphs) == 0:
            raise DataError(f"{artifacts.path}: no subgraphs for split '{split}'; check the dataset's query splits")
        rows = artifacts.query_rows(subgraphs.query_ids)
        return cls(
            node_features=artifacts.node_features,
            relation_features=np.array(artifacts.relation_features, dtype=np.float32),
            query_features=np.asarray(artifacts.query_features[rows], dtype=np.float32),
            subgraphs=subgraphs,
        )

    def take(self, index: np.ndarray) -> "TrainingData":
        return TrainingData(self.node_features, self.relation_features, self.query_features[index], self.subgraphs.take(index))

    def batch(self, index: np.ndarray) -> QueryBatch:
        return make_query_batch(
            self.subgraphs.take(index), self.node_features, self.query_features[index], self.num_relations
        )


def selection_score(val: dict[str, float]) -> float:
    """What the best checkpoint is kept by: validation Recall@20, ties broken by MRR. Recall@20
    saturates once every answer is in the top 20 (it does on the synthetic task after two epochs),
    and later epochs still improve the order inside it; a Recall@20 difference of 0.001 or more still
    outweighs any MRR difference."""
    return val["recall_at_20"] + 1e-3 * val["mrr"]


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live; batches and features follow it."""
    return next(model.parameters()).device


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
    history: list[dict[str, Any]] = field(default_factory=list)
    order_rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    sample_generator: torch.Generator = field(default_factory=torch.Generator)


def check_schedule(sizes: list[int], caps: list[int], section: str) -> None:
    """An expansion schedule (``section``.expansion_sizes / .frontier_caps): one positive c_t per step,
    each at most its step's frontier cap."""
    if len(sizes) != len(caps):
        raise ConfigError(
            f"{section}.expansion_sizes {sizes} and {section}.frontier_caps {caps} must have one entry per expansion step"
        )
    if any(int(c) < 1 for c in [*sizes, *caps]):
        raise ConfigError(f"{section}.expansion_sizes {sizes} and {section}.frontier_caps {caps} must be positive")
    if any(c > cap for c, cap in zip(sizes, caps)):
        raise ConfigError(f"each {section}.expansion_sizes[t] must be <= {section}.frontier_caps[t]")


def _check(config: SeederConfig) -> None:
    train = config.train
    check_schedule(train.expansion_sizes, train.frontier_caps, "train")
    if train.mode not in ("seeder", "rerank"):
        raise ConfigError(f"train.mode={train.mode!r}: use 'seeder' or 'rerank'")
    if train.num_trajectories < 1 or train.temperature <= 0:
        raise ConfigError("train.num_trajectories must be >= 1 and train.temperature > 0")
    advantages(torch.zeros(1, 1), train.baseline, torch.zeros(1))  # validates the name


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


def build_state(config: SeederConfig, feature_dim: int, steps_per_epoch: int) -> TrainState:
    _check(config)
    torch.manual_seed(config.train.seed)
    model = SeedERPolicy(feature_dim, config.model)
    if config.train.init_from:
        payload = _read(config.train.init_from)
        saved_model = to_dict(from_dict(SeederConfig, payload["config"]).model)  # older files: defaults filled in
        if payload["feature_dim"] != feature_dim or saved_model != to_dict(config.model):
            raise ConfigError(
                f"train.init_from={config.train.init_from}: its model ({saved_model}, feature dim "
                f"{payload['feature_dim']}) differs from this run's ({to_dict(config.model)}, {feature_dim}); "
                "use the same model.* settings"
            )
        model.load_state_dict(payload["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(steps_per_epoch, config.train.warmup_epochs, config.train.epochs)
    )
    generator = torch.Generator()
    generator.manual_seed(config.train.seed + 1)
    return TrainState(
        config=config,
        feature_dim=feature_dim,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        steps_per_epoch=steps_per_epoch,
        order_rng=np.random.default_rng(config.train.seed),
        sample_generator=generator,
    )


def trainable_queries(data: TrainingData, config: SeederConfig) -> np.ndarray:
    """Positions of the queries trained on (those with an answer inside their subgraph, by default)."""
    if not config.train.skip_unanswerable:
        return np.arange(len(data.subgraphs))
    sg = data.subgraphs
    answered = np.add.reduceat(sg.is_answer.astype(np.int64), sg.node_ptr[:-1]) if len(sg.nodes) else np.zeros(len(sg))
    answered = np.where(np.diff(sg.node_ptr) > 0, answered, 0)
    return np.flatnonzero(answered > 0)


def steps_per_epoch(data: TrainingData, config: SeederConfig) -> int:
    n = len(trainable_queries(data, config))
    if config.train.queries_per_epoch:
        n = min(n, config.train.queries_per_epoch)
    return max(1, math.ceil(n / config.train.batch_size))


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
        loss_rank = bpr_loss(
            out.scores[sampled_rows], out.selected[sampled_rows], is_answer[sampled_rows], cfg.bpr_margin
        )
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
    state: TrainState, data: TrainingData, progress: Callable[[str], None] | None = None
) -> dict[str, float]:
    """One epoch over (a seeded sample of) the trainable queries; returns the epoch's mean metrics."""
    cfg = state.config.train
    pool = trainable_queries(data, state.config)
    if len(pool) == 0:
        raise DataError("no training query has an answer inside its bounded subgraph; check the preprocessing")
    order = state.order_rng.permutation(pool)
    if cfg.queries_per_epoch:
        order = order[: cfg.queries_per_epoch]
    device = model_device(state.model)
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    sums: dict[str, float] = {}
    start = time.perf_counter()
    num_batches = math.ceil(len(order) / cfg.batch_size)
    report_every = max(1, num_batches // 10)
    for i in range(num_batches):
        index = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        metrics = train_step(state, data.batch(index).to(device), relation_features)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
        if progress and ((i + 1) % report_every == 0 or i + 1 == num_batches):
            elapsed = time.perf_counter() - start
            progress(
                f"epoch {state.epoch + 1} batch {i + 1}/{num_batches} loss {sums['loss'] / (i + 1):.4f} "
                f"reward {sums['reward'] / (i + 1):.3f} ({(i + 1) * len(index) / elapsed:.1f} queries/s)"
            )
    state.epoch += 1
    out = {key: value / num_batches for key, value in sums.items()}
    elapsed = time.perf_counter() - start
    out["epoch_seconds"] = elapsed
    copies = cfg.num_trajectories if cfg.mode == "seeder" else 1
    out["trajectories_per_second"] = len(order) * copies / elapsed
    return out


@torch.no_grad()
def retrieve(
    model: SeedERPolicy, data: TrainingData, config: SeederConfig, length: int | None = None
) -> tuple[RetrievalResult, np.ndarray, np.ndarray]:
    """Greedy rollouts (Algorithm 1) of every query in ``data``: the ranking and, per ranked node, the
    expansion step at which it was reached (0 seeds, t+1 step t, -1 outside the final set) and its score
    (the model's for the retrieved set, the K-hop filter score for the rest; NaN for padding)."""
    length = length or config.eval.ranking_length
    model.eval()
    device = model_device(model)
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    results, steps, node_scores = [], [], []
    batch_size = config.train.eval_batch_size
    for lo in range(0, len(data.subgraphs), batch_size):
        index = np.arange(lo, min(lo + batch_size, len(data.subgraphs)))
        batch = data.batch(index).to(device)
        if config.train.mode == "rerank":
            scores = score_whole_subgraph(model, batch, relation_features)
            budget = int(config.seed.k0 + sum(config.train.expansion_sizes))
            top = torch.topk(scores, min(budget, scores.shape[1]), dim=1).indices
            in_set = torch.zeros_like(batch.valid)
            in_set.scatter_(1, top, True)
            in_set &= batch.valid
            reached_at = torch.where(in_set, 0, -1)
        else:
            rollout = Rollout(model, batch, relation_features, copies=1)
            greedy = torch.ones(batch.num_queries, dtype=torch.bool, device=device)
            out = rollout.run(config.train.expansion_sizes, config.train.frontier_caps, greedy)
            in_set, scores, reached_at = out.selected, out.scores, out.reached_at
        result = rank_nodes(batch, in_set, scores, length)
        results.append(result)
        # The step of every ranked node: look up each ranked id among its query's nodes.
        node_ids = batch.global_nodes.cpu().numpy()
        ranked = result.ranking
        match = (ranked[:, :, None] == node_ids[:, None, :]) & (ranked[:, :, None] >= 0)
        pos = match.argmax(2)
        step = np.take_along_axis(reached_at.cpu().numpy(), pos, 1)
        found = match.any(2)
        steps.append(np.where(found, step, -1))
        shown = torch.where(in_set, scores, batch.filter_score).cpu().numpy()
        node_scores.append(np.where(found, np.take_along_axis(shown, pos, 1), np.nan))
    width = max(r.ranking.shape[1] for r in results)
    result = RetrievalResult(
        query_ids=np.concatenate([r.query_ids for r in results]),
        ranking=np.concatenate([r.ranking for r in results]),
        set_size=np.concatenate([r.set_size for r in results]),
    )
    assert result.ranking.shape[1] == width
    return result, np.concatenate(steps), np.concatenate(node_scores)


def ranking_metrics(
    result: RetrievalResult, answer_ptr: np.ndarray, answers: np.ndarray, ks: list[int]
) -> dict[str, np.ndarray]:
    """Per-query Hit@k, Recall@k, MRR and Hit/Recall@any (the retrieved set), from ranks alone."""
    num_q, length = result.ranking.shape
    span = int(max(answers.max(initial=0), result.ranking.max(initial=0))) + 2
    answer_query = np.repeat(np.arange(num_q), np.diff(answer_ptr))
    answer_keys = answer_query * span + answers
    ranked_keys = np.arange(num_q)[:, None] * span + result.ranking
    hit = np.isin(ranked_keys, answer_keys) & (result.ranking >= 0)
    num_answers = np.maximum(np.diff(answer_ptr), 1)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        out[f"hit_at_{k}"] = hit[:, :k].any(1).astype(np.float64)
        out[f"recall_at_{k}"] = hit[:, :k].sum(1) / num_answers
    in_set = np.arange(length)[None, :] < result.set_size[:, None]
    out["hit_at_any"] = (hit & in_set).any(1).astype(np.float64)
    out["recall_at_any"] = (hit & in_set).sum(1) / num_answers
    first = np.where(hit.any(1), hit.argmax(1) + 1, np.inf)
    out["mrr"] = 1.0 / first
    return out


def evaluate(model: SeedERPolicy, data: TrainingData, config: SeederConfig) -> tuple[RetrievalResult, dict[str, float]]:
    """Greedy retrieval of every query in ``data`` and its mean metrics (eval.ks cut-offs)."""
    result, _, _ = retrieve(model, data, config)
    per_query = ranking_metrics(result, data.subgraphs.answer_ptr, data.subgraphs.answers, config.eval.ks)
    return result, {key: float(values.mean()) for key, values in per_query.items()}


# -- checkpoints ----------------------------------------------------------------------------------


def save_checkpoint(state: TrainState, path: str | Path) -> None:
    """Write model, optimiser, scheduler, epoch, RNG states and config; atomic (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": CHECKPOINT_VERSION,
        "config": to_dict(state.config),
        "feature_dim": state.feature_dim,
        "steps_per_epoch": state.steps_per_epoch,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "epoch": state.epoch,
        "best_metric": state.best_metric,
        "history": state.history,
        "order_rng": state.order_rng.bit_generator.state,
        "sample_rng": state.sample_generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def _read(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint {path} does not exist; train one with `python -m seeder.train --out DIR`")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise DataError(f"checkpoint {path} cannot be read ({exc}); retrain or pick another file") from exc
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION:
        raise DataError(f"checkpoint {path} is not a SeedER checkpoint of version {CHECKPOINT_VERSION}")
    return payload


def load_checkpoint(path: str | Path) -> TrainState:
    """Rebuild the full training state saved by ``save_checkpoint`` (resumes bit for bit on CPU)."""
    payload = _read(path)
    config = from_dict(SeederConfig, payload["config"])
    state = build_state(config, payload["feature_dim"], payload["steps_per_epoch"])
    state.model.load_state_dict(payload["model"])
    state.optimizer.load_state_dict(payload["optimizer"])
    state.scheduler.load_state_dict(payload["scheduler"])
    state.epoch = payload["epoch"]
    state.best_metric = payload["best_metric"]
    state.history = payload["history"]
    state.order_rng.bit_generator.state = payload["order_rng"]
    state.sample_generator.set_state(payload["sample_rng"])
    torch.set_rng_state(payload["torch_rng"])
    return state


def load_model(path: str | Path) -> tuple[SeedERPolicy, SeederConfig]:
    """The trained policy (eval mode) and its config, for retrieval."""
    payload = _read(path)
    config = from_dict(SeederConfig, payload["config"])
    model = SeedERPolicy(payload["feature_dim"], config.model)
    model.load_state_dict(payload["model"])
    model.eval()
    return model, config


# -- driver -----------------------------------------------------------------------------------------


def fit(
    config: SeederConfig,
    train_data: TrainingData,
    val_data: TrainingData | None,
    out_dir: str | Path,
    resume: bool = True,
    log: Callable[[str], None] = print,
) -> TrainState:
    """Train for ``config.train.epochs``; resume from ``out_dir/last.pt`` when present."""
    if config.train.num_threads:
        torch.set_num_threads(config.train.num_threads)
    out_dir = Path(out_dir)
    last, best = out_dir / "last.pt", out_dir / "best.pt"
    if resume and last.is_file():
        state = load_checkpoint(last)
        log(f"resumed from {last} after epoch {state.epoch}")
    else:
        state = build_state(config, train_data.feature_dim, steps_per_epoch(train_data, config))
    if val_data is not None and config.train.val_queries and len(val_data.subgraphs) > config.train.val_queries:
        pick = np.random.default_rng(config.train.seed).choice(len(val_data.subgraphs), config.train.val_queries, replace=False)
        val_data = val_data.take(np.sort(pick))
    while state.epoch < config.train.epochs:
        metrics = train_epoch(state, train_data, progress=log)
        if val_data is not None:
            start = time.perf_counter()
            _, val = evaluate(state.model, val_data, state.config)
            metrics.update({f"val_{k}": v for k, v in val.items()})
            metrics["val_seconds"] = time.perf_counter() - start
        metrics["epoch"] = state.epoch
        state.history.append(metrics)
        log(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
        score = selection_score(val) if val_data is not None else -metrics["loss"]
        if score > state.best_metric:
            state.best_metric = score
            save_checkpoint(state, best)
        save_checkpoint(state, last)
    return state


def main(argv: list[str] | None = None) -> int:
    from seeder.artifacts import open_artifacts

    parser = argparse.ArgumentParser(prog="python -m seeder.train", description="Train the SeedER policy (no Ray).")
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory")
    parser.add_argument("--config", help="YAML config (model/train sections); default: the artifacts' own config")
    parser.add_argument("--out", required=True, help="run directory for last.pt / best.pt / history.json")
    parser.add_argument("--no-resume", action="store_true", help="start fresh even if OUT/last.pt exists")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3")
    args = parser.parse_args(argv)
    try:
        artifacts = open_artifacts(args.artifacts)
        config = training_config(artifacts.config, args.config, args.overrides)
        train_data = TrainingData.from_artifacts(artifacts, "train")
        val_data = TrainingData.from_artifacts(artifacts, "val")
        state = fit(config, train_data, val_data, args.out, resume=not args.no_resume)
        Path(args.out, "history.json").write_text(json.dumps(state.history, indent=2))
    except (DataError, ConfigError) as exc:
        print(f"seeder train: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


def toy_task(num_queries: int = 64, nodes_per_query: int = 30, dim: int = 8, num_relations: int = 3, seed: int = 0):
    """A tiny learnable retrieval task for tests and smoke runs: (TrainingData, answers decided by structure).

    Each query owns ``nodes_per_query`` fresh nodes: 3 seeds (hop 0), a third of the rest at hop 1 (one
    edge from a random seed), the others at hop 2 (one edge from a random hop-1 node); relations are
    random. The answers are the hop-2 nodes reached by the relation path (1, 0) from the seeds, so only a
    model that reads relations and structure finds them; filter scores are noise.
    """
    rng = np.random.default_rng(seed)
    n = nodes_per_query
    num_hop1 = (n - 3) // 3
    hop = np.concatenate([np.zeros(3), np.ones(num_hop1), np.full(n - 3 - num_hop1, 2)]).astype(np.int8)
    parent = np.concatenate(
        [rng.integers(0, 3, size=(num_queries, num_hop1)), rng.integers(3, 3 + num_hop1, size=(num_queries, n - 3 - num_hop1))],
        axis=1,
    )  # [Q, n-3], local parent of nodes 3..n-1
    relation = rng.integers(0, num_relations, size=(num_queries, n - 3))
    parent_rel = np.concatenate([np.full((num_queries, 3), -1), relation], axis=1)  # relation into node
    grand_rel = np.take_along_axis(parent_rel, np.concatenate([np.zeros((num_queries, 3), int), parent], 1), 1)
    is_answer = (hop[None, :] == 2) & (parent_rel == 0) & (grand_rel == 1)
    # Guarantee one answer per query: make node n-1 an answer under hop-1 node 3 reached by relation 1.
    parent[:, 0] = 0
    relation[:, 0] = 1
    parent_rel[:, 3] = 1
    parent[:, -1] = 3
    relation[:, -1] = 0
    parent_rel[:, -1] = 0
    grand_rel = np.take_along_axis(parent_rel, np.concatenate([np.zeros((num_queries, 3), int), parent], 1), 1)
    is_answer = (hop[None, :] == 2) & (parent_rel == 0) & (grand_rel == 1)
    nodes = np.arange(num_queries * n, dtype=np.int64)
    answers = [nodes[q * n : (q + 1) * n][is_answer[q]] for q in range(num_queries)]
    answer_ptr = np.zeros(num_queries + 1, dtype=np.int64)
    answer_ptr[1:] = np.cumsum([len(a) for a in answers])
    edges_per_query = n - 3
    subgraphs = SubgraphSet(
        query_ids=np.arange(num_queries, dtype=np.int64),
        splits=np.array(["train"] * num_queries, dtype=object),
        node_ptr=np.arange(num_queries + 1, dtype=np.int64) * n,
        nodes=nodes,
        hop=np.tile(hop, num_queries),
        score=rng.random(num_queries * n).astype(np.float32),
        is_answer=is_answer.reshape(-1),
        path_end=np.zeros(num_queries * n, np.float32),
        edge_ptr=np.arange(num_queries + 1, dtype=np.int64) * edges_per_query,
        edge_src=parent.reshape(-1).astype(np.int32),
        edge_dst=np.tile(np.arange(3, n, dtype=np.int32), num_queries),
        edge_rel=relation.reshape(-1).astype(np.int32),
        answer_ptr=answer_ptr,
        answers=np.concatenate(answers),
    )
    node_features = rng.normal(size=(num_queries * n, dim)).astype(np.float32)
    node_features /= np.linalg.norm(node_features, axis=1, keepdims=True)
    relation_features = rng.normal(size=(2 * num_relations, dim)).astype(np.float32)
    query_features = rng.normal(size=(num_queries, dim)).astype(np.float32)
    return TrainingData(node_features, relation_features, query_features, subgraphs)
