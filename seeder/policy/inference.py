"""Greedy SeedER inference (paper, Algorithm 1): the one path from a trained policy to rankings.

Training validation, ``seeder evaluate --method seeder``, ``seeder benchmark``, ``seeder retrieve``,
the Python ``Retriever`` and the sweep's champion evaluation all rank through ``retrieve`` below.
The expansion schedule (c_t and the frontier caps) is an argument: the weights do not depend on it,
so a model trained with one budget retrieves with another.

Multi-rollout voting (ARK; ``eval.rollouts`` R > 0): each question's greedy rollout and R sampled
ones run as 1 + R copies of one batched rollout, and ``fuse_rankings`` merges their rankings by
reciprocal rank or by votes. Validation during training stays greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from seeder.config import ConfigError, Fusion, SeederConfig, TrainMode, choices
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.policy.model import SeedERPolicy
from seeder.policy.rollout import QueryBatch, Rollout, make_query_batch, rank_nodes, score_whole_subgraph
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.metrics import per_query_metrics
from seeder.system.allocator import keep_freed_memory
from seeder.system.io import DataError
from seeder.system.progress import Progress

RRF_K = 60
"""The constant of reciprocal rank fusion: a node at (0-based) rank r of a rollout's ranking adds
1 / (RRF_K + r + 1) (Cormack et al.'s k = 60)."""

# Node features up to this size move to a training or inference GPU whole; larger ones (a 10M-node
# graph at d = 256 takes 10 GB) stay on the host and each batch's rows are gathered there.
DEVICE_FEATURES_MAX_BYTES = 4 << 30


@dataclass
class QueryData:
    """What training and inference read: features by row and some queries' bounded subgraphs."""

    node_features: np.ndarray  # [N, d], may be a memmap (or a tensor on a GPU: ``on``)
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
    def from_artifacts(cls, artifacts, split: str) -> "QueryData":
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

    @classmethod
    def concat(cls, parts: list["QueryData"]) -> "QueryData":
        """Several graphs' queries as one, for training one model on them all: node and query ids are
        offset per graph, and the relation rows are every graph's base relations, then every graph's
        inverses, in the same order (a row's half is its direction, ``SeedERPolicy.encode_relations``)."""
        if len(parts) == 1:
            return parts[0]
        dims = sorted({p.feature_dim for p in parts})
        if len(dims) > 1:
            raise DataError(
                f"the graphs' features have {' and '.join(map(str, dims))} dims; train on artifacts "
                "built with the same encoder and reduce.dim=0"
            )
        node_offset = np.cumsum([0] + [len(p.node_features) for p in parts])
        relation_offset = np.cumsum([0] + [p.num_relations for p in parts])
        query_offset = np.cumsum([0] + [int(p.subgraphs.query_ids.max(initial=-1)) + 1 for p in parts])
        subgraphs = [
            replace(
                p.subgraphs,
                query_ids=p.subgraphs.query_ids + query_offset[g],
                nodes=p.subgraphs.nodes + node_offset[g],
                answers=p.subgraphs.answers + node_offset[g],
                edge_rel=(p.subgraphs.edge_rel + relation_offset[g]).astype(p.subgraphs.edge_rel.dtype),
            )
            for g, p in enumerate(parts)
        ]
        relations = [np.asarray(p.relation_features, dtype=np.float32) for p in parts]
        return cls(
            node_features=np.concatenate([np.asarray(p.node_features, dtype=np.float32) for p in parts]),
            relation_features=np.concatenate([r[: len(r) // 2] for r in relations] + [r[len(r) // 2 :] for r in relations]),
            query_features=np.concatenate([p.query_features for p in parts]),
            subgraphs=SubgraphSet.concat(subgraphs),
        )

    def on(self, device: torch.device | str) -> "QueryData":
        """The same queries, with the node features copied to ``device`` once when that is a GPU and they
        fit in ``DEVICE_FEATURES_MAX_BYTES``: batches then gather their rows on the GPU. Host-side
        gathering and the host-to-device copy of every batch's [nodes, d] rows took a third of a
        training step at 2,048 queries per batch on an H200."""
        device = torch.device(device)
        if device.type == "cpu" or isinstance(self.node_features, torch.Tensor):
            return self
        if self.node_features.nbytes > DEVICE_FEATURES_MAX_BYTES:
            return self
        rows = torch.from_numpy(np.ascontiguousarray(self.node_features, dtype=np.float32)).to(device)
        return QueryData(rows, self.relation_features, self.query_features, self.subgraphs)

    def take(self, index: np.ndarray) -> "QueryData":
        return QueryData(self.node_features, self.relation_features, self.query_features[index], self.subgraphs.take(index))

    def batch(self, index: np.ndarray) -> QueryBatch:
        return make_query_batch(self.subgraphs.take(index), self.node_features, self.query_features[index], self.num_relations)


@dataclass(frozen=True)
class Schedule:
    """Algorithm 1's inputs besides the model: the nodes added per step (c_t) and each step's
    frontier cap. ``mode="rerank"`` (the GNN-reranking ablation) scores the whole subgraph instead and
    keeps the top ``k0 + sum(c_t)``. ``rollouts`` > 0 adds that many sampled rollouts (Gumbel-top-k at
    ``temperature``, noise from ``seed``) next to the greedy one and fuses the rankings by ``fusion``."""

    expansion_sizes: tuple[int, ...]
    frontier_caps: tuple[int, ...]
    mode: str = "seeder"
    k0: int = 1
    rollouts: int = 0
    fusion: str = "rrf"
    seed: int = 0
    temperature: float = 1.0
    prior_nodes: int = 0

    def __post_init__(self) -> None:
        check_schedule(list(self.expansion_sizes), list(self.frontier_caps), "expansion")
        if self.mode not in choices(TrainMode):
            raise ConfigError(f"train.mode={self.mode!r}: use one of {', '.join(choices(TrainMode))}")
        if self.rollouts < 0:
            raise ConfigError(f"eval.rollouts={self.rollouts}: use 0 (greedy only) or more sampled rollouts")
        if self.fusion not in choices(Fusion):
            raise ConfigError(f"eval.fusion={self.fusion!r}: use one of {', '.join(choices(Fusion))}")
        if self.prior_nodes < 0:
            raise ConfigError(f"eval.prior_nodes={self.prior_nodes}: use 0 (off) or a positive count")
        if self.rollouts and not self.temperature > 0:
            raise ConfigError(f"the model's train.temperature={self.temperature} must be > 0 to sample rollouts")

    @classmethod
    def training(cls, config: SeederConfig) -> "Schedule":
        """The schedule the policy trains with (``train.*``); validation ranks with ``eval.prior_nodes``
        as inference does."""
        t = config.train
        return cls(
            tuple(t.expansion_sizes),
            tuple(t.frontier_caps),
            t.mode,
            int(config.seed.k0),
            prior_nodes=int(config.eval.prior_nodes),
        )

    @classmethod
    def evaluation(cls, config: SeederConfig, model_config: SeederConfig) -> "Schedule":
        """``config``'s ``eval.expansion_sizes`` / ``eval.frontier_caps`` (either empty: the model's
        training value), with the model's mode, and ``config``'s voting (``eval.rollouts``,
        ``eval.fusion``, ``eval.rollout_seed``) at the model's sampling temperature, and ``config``'s
        ``eval.prior_nodes``."""
        sizes = list(config.eval.expansion_sizes) or list(model_config.train.expansion_sizes)
        caps = list(config.eval.frontier_caps) or list(model_config.train.frontier_caps)
        check_schedule(sizes, caps, "eval")
        return cls(
            tuple(int(c) for c in sizes),
            tuple(int(c) for c in caps),
            model_config.train.mode,
            int(config.seed.k0),
            rollouts=int(config.eval.rollouts),
            fusion=config.eval.fusion,
            seed=int(config.eval.rollout_seed),
            temperature=float(model_config.train.temperature),
            prior_nodes=int(config.eval.prior_nodes),
        )

    @property
    def budget(self) -> int:
        return int(self.k0 + sum(self.expansion_sizes))


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


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live; batches and features follow it."""
    return next(model.parameters()).device


@torch.inference_mode()  # not no_grad: no version counters or views to track (~1 ms a question)
def retrieve(
    model: SeedERPolicy,
    data: QueryData,
    schedule: Schedule,
    length: int,
    batch_size: int = 64,
    progress: str | None = None,
) -> tuple[RetrievalResult, np.ndarray, np.ndarray]:
    """Greedy rollouts of every query in ``data``, ``batch_size`` queries per forward pass: the ranking
    and, per ranked node, the expansion step at which it was reached (0 seeds, t+1 step t, -1 outside
    the final set) and its score (the model's for the retrieved set, the K-hop filter score for the
    rest; NaN for padding). ``progress`` names a ``seeder.system.progress.Progress`` over the queries.

    With ``schedule.rollouts`` R > 0 every query also gets R sampled rollouts (``voted_rollout``): the
    set is the union of the 1 + R sets, ranked by the fused score (which is then the score shown), and
    a node's step is the earliest at which a rollout reached it. The noise comes from one generator
    seeded with ``schedule.seed`` per call, so a call is reproducible (for the same ``batch_size``)."""
    if model.training:  # eval() walks every submodule: 0.5 ms of a single question's ranking
        model.eval()
    keep_freed_memory()  # a batch's tensors would otherwise be faulted in afresh on every pass
    device = model_device(model)
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    results, steps, node_scores = [], [], []
    generator = torch.Generator().manual_seed(schedule.seed) if schedule.rollouts else None
    bar = Progress(len(data.subgraphs), progress, "queries") if progress else None
    for lo in range(0, len(data.subgraphs), batch_size):
        index = np.arange(lo, min(lo + batch_size, len(data.subgraphs)))
        batch = data.batch(index).to(device)
        # The cosine filter gives no path ends (all 0): nothing for the prior to add.
        prior_nodes = schedule.prior_nodes if bool(batch.path_end.any()) else 0
        if schedule.mode == "rerank":
            scores = score_whole_subgraph(model, batch, relation_features)
            top = torch.topk(scores, min(schedule.budget, scores.shape[1]), dim=1).indices
            in_set = torch.zeros_like(batch.valid)
            in_set.scatter_(1, top, True)
            in_set &= batch.valid
            reached_at = torch.where(in_set, 0, -1)
        elif schedule.rollouts:
            in_set, scores, reached_at = voted_rollout(model, batch, relation_features, schedule, length, generator, prior_nodes)
        else:
            rollout = Rollout(model, batch, relation_features, copies=1)
            out = rollout.run(list(schedule.expansion_sizes), list(schedule.frontier_caps), greedy=True, prior_nodes=prior_nodes)
            in_set, scores, reached_at = out.selected, out.scores, out.reached_at
        result = rank_nodes(batch, in_set, scores, length)
        results.append(result)
        # The step of every ranked node: look up each ranked id among its query's nodes.
        pos, found = positions_in_rows(batch.global_nodes.cpu().numpy(), result.ranking)
        step = np.take_along_axis(reached_at.cpu().numpy(), pos, 1)
        steps.append(np.where(found, step, -1))
        shown = torch.where(in_set, scores, batch.filter_score).cpu().numpy()
        node_scores.append(np.where(found, np.take_along_axis(shown, pos, 1), np.nan))
        if bar is not None:
            bar.update(len(index))
    if bar is not None:
        bar.close()
    if not results:
        empty = np.zeros((0, length))
        return (
            RetrievalResult(np.zeros(0, np.int64), empty.astype(np.int64), np.zeros(0, np.int64)),
            empty.astype(np.int64),
            empty,
        )
    result = RetrievalResult(
        query_ids=np.concatenate([r.query_ids for r in results]),
        ranking=np.concatenate([r.ranking for r in results]),
        set_size=np.concatenate([r.set_size for r in results]),
    )
    return result, np.concatenate(steps), np.concatenate(node_scores)


def voted_rollout(
    model: SeedERPolicy,
    batch: QueryBatch,
    relation_features: torch.Tensor,
    schedule: Schedule,
    length: int,
    generator: torch.Generator,
    prior_nodes: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batched rollout of 1 + R copies per query (copy 0 greedy, the others Gumbel-top-k samples,
    as training samples its trajectories), each copy ranked as ``rank_nodes`` ranks, the rankings fused
    by ``fuse_rankings``. -> (union of the sets [B, P], fused score [B, P], earliest step [B, P])."""
    copies = 1 + schedule.rollouts
    greedy = torch.zeros(batch.num_queries, copies, dtype=torch.bool, device=batch.valid.device)
    greedy[:, 0] = True
    rollout = Rollout(model, batch, relation_features, copies)
    out = rollout.run(
        list(schedule.expansion_sizes),
        list(schedule.frontier_caps),
        greedy.view(-1),
        schedule.temperature,
        generator,
        prior_nodes,
    )
    ranks = ranks_in_copies(batch, out.selected, out.scores, copies)
    shape = (batch.num_queries, copies, batch.width)
    in_set, fused = fuse_rankings(out.selected.view(shape), ranks.view(shape), batch.valid, schedule.fusion, length)
    reached = out.reached_at.view(shape)
    earliest = torch.where(reached >= 0, reached, torch.iinfo(reached.dtype).max).amin(1)
    return in_set, fused, torch.where(in_set, earliest, -1)


def ranks_in_copies(batch: QueryBatch, selected: torch.Tensor, scores: torch.Tensor, copies: int) -> torch.Tensor:
    """Each node's 0-based rank in its copy's ranking, ordered as ``rank_nodes`` orders one (the set by
    model score, then the rest by filter score, ties by node id; padding last). [G, P] -> [G, P]."""
    node_id = batch.global_nodes.repeat_interleave(copies, 0)
    valid = batch.valid.repeat_interleave(copies, 0)
    secondary = torch.where(selected, scores, batch.filter_score.repeat_interleave(copies, 0))
    group = torch.where(selected, 0, torch.where(valid, 1, 2))
    order = torch.argsort(node_id, dim=1, stable=True)
    order = order.gather(1, torch.argsort(-secondary.gather(1, order), dim=1, stable=True))
    order = order.gather(1, torch.argsort(group.gather(1, order), dim=1, stable=True))
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


def fuse_rankings(
    selected: torch.Tensor, ranks: torch.Tensor, valid: torch.Tensor, fusion: str, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fuse C rankings per query: ``selected`` [B, C, P] (each rollout's set), ``ranks`` [B, C, P] (0-based
    rank of each node in each rollout's ranking), ``valid`` [B, P]. A rollout counts for the nodes within
    its first ``length`` ranks. ``rrf``: the sum of 1 / (RRF_K + rank + 1). ``votes``: the number of
    rollouts whose set holds the node, plus less than one for its reciprocal-rank sum (the tie-break).
    -> (union of the sets [B, P], fused score [B, P], larger first)."""
    listed = (ranks < length) & valid.unsqueeze(1)
    reciprocal = torch.where(listed, 1.0 / (RRF_K + ranks.to(torch.float64) + 1), 0.0).sum(1)
    if fusion == "votes":
        most = selected.shape[1] / (RRF_K + 1)  # every rollout ranking the node first
        fused = selected.sum(1).to(torch.float64) + 0.5 * reciprocal / most
    else:
        fused = reciprocal
    return selected.any(1) & valid, fused.to(torch.float32)


def positions_in_rows(table: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ids [B, L] (-1 padding), the column of each id in the same row of ``table`` [B, W] (-1
    padding), the first where it repeats, and whether it is there: one sort and a binary search (a
    [B, L, W] comparison was 3 ms per 64 questions)."""
    rows, width = table.shape
    span = int(max(table.max(initial=-1), ids.max(initial=-1))) + 2  # ids + 1 in [0, span)
    row = np.arange(rows, dtype=np.int64)[:, None]
    keys = (row * span + table + 1).ravel()
    order = np.argsort(keys, kind="stable")
    found, at = sorted_lookup(keys[order], row * span + ids + 1)
    return (order[at] % width if len(order) else at), found & (ids >= 0)


def evaluate_per_query(
    model: SeedERPolicy, data: QueryData, config: SeederConfig
) -> tuple[RetrievalResult, dict[str, np.ndarray]]:
    """Greedy retrieval of ``data`` with the training schedule, and every metric of
    ``seeder.retrieve.metrics`` per query (the names ``seeder evaluate`` reports)."""
    result, _, _ = retrieve(
        model, data, Schedule.training(config), config.eval.ranking_length, config.train.eval_batch_size, progress="validate"
    )
    return result, per_query_metrics(result, data.subgraphs.answer_ptr, data.subgraphs.answers, config.eval.ks)


def mean_metrics(per_query: dict[str, np.ndarray]) -> dict[str, float]:
    """Each per-query metric averaged over the queries."""
    return {key: float(values.mean()) for key, values in per_query.items()}


def evaluate(model: SeedERPolicy, data: QueryData, config: SeederConfig) -> tuple[RetrievalResult, dict[str, float]]:
    """Validation during training: ``evaluate_per_query``'s metrics averaged over the queries."""
    result, per_query = evaluate_per_query(model, data, config)
    return result, mean_metrics(per_query)
