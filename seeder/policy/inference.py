"""Greedy SeedER inference (paper, Algorithm 1): the one path from a trained policy to rankings.

Training validation, ``seeder evaluate --method seeder``, ``seeder benchmark``, ``seeder retrieve``,
the Python ``Retriever`` and the sweep's champion evaluation all rank through ``retrieve`` below.
The expansion schedule (c_t and the frontier caps) is an argument: the weights do not depend on it,
so a model trained with one budget retrieves with another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from seeder.config import ConfigError, SeederConfig, TrainMode, choices
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.policy.model import SeedERPolicy
from seeder.policy.rollout import QueryBatch, Rollout, make_query_batch, rank_nodes, score_whole_subgraph
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.metrics import per_query_metrics
from seeder.system.allocator import keep_freed_memory
from seeder.system.io import DataError
from seeder.system.progress import Progress

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
    keeps the top ``k0 + sum(c_t)``."""

    expansion_sizes: tuple[int, ...]
    frontier_caps: tuple[int, ...]
    mode: str = "seeder"
    k0: int = 1

    def __post_init__(self) -> None:
        check_schedule(list(self.expansion_sizes), list(self.frontier_caps), "expansion")
        if self.mode not in choices(TrainMode):
            raise ConfigError(f"train.mode={self.mode!r}: use one of {', '.join(choices(TrainMode))}")

    @classmethod
    def training(cls, config: SeederConfig) -> "Schedule":
        """The schedule the policy trains with (``train.*``)."""
        t = config.train
        return cls(tuple(t.expansion_sizes), tuple(t.frontier_caps), t.mode, int(config.seed.k0))

    @classmethod
    def evaluation(cls, config: SeederConfig, model_config: SeederConfig) -> "Schedule":
        """``config``'s ``eval.expansion_sizes`` / ``eval.frontier_caps`` (either empty: the model's
        training value), with the model's mode."""
        sizes = list(config.eval.expansion_sizes) or list(model_config.train.expansion_sizes)
        caps = list(config.eval.frontier_caps) or list(model_config.train.frontier_caps)
        check_schedule(sizes, caps, "eval")
        return cls(tuple(int(c) for c in sizes), tuple(int(c) for c in caps), model_config.train.mode, int(config.seed.k0))

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
    rest; NaN for padding). ``progress`` names a ``seeder.system.progress.Progress`` over the queries."""
    if model.training:  # eval() walks every submodule: 0.5 ms of a single question's ranking
        model.eval()
    keep_freed_memory()  # a batch's tensors would otherwise be faulted in afresh on every pass
    device = model_device(model)
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    results, steps, node_scores = [], [], []
    bar = Progress(len(data.subgraphs), progress, "queries") if progress else None
    for lo in range(0, len(data.subgraphs), batch_size):
        index = np.arange(lo, min(lo + batch_size, len(data.subgraphs)))
        batch = data.batch(index).to(device)
        if schedule.mode == "rerank":
            scores = score_whole_subgraph(model, batch, relation_features)
            top = torch.topk(scores, min(schedule.budget, scores.shape[1]), dim=1).indices
            in_set = torch.zeros_like(batch.valid)
            in_set.scatter_(1, top, True)
            in_set &= batch.valid
            reached_at = torch.where(in_set, 0, -1)
        else:
            rollout = Rollout(model, batch, relation_features, copies=1)
            out = rollout.run(list(schedule.expansion_sizes), list(schedule.frontier_caps), greedy=True)
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


def evaluate(model: SeedERPolicy, data: QueryData, config: SeederConfig) -> tuple[RetrievalResult, dict[str, float]]:
    """Validation during training: greedy retrieval of ``data`` with the training schedule, and the
    mean of every metric of ``seeder.retrieve.metrics`` (the names ``seeder evaluate`` reports)."""
    result, _, _ = retrieve(
        model, data, Schedule.training(config), config.eval.ranking_length, config.train.eval_batch_size, progress="validate"
    )
    per_query = per_query_metrics(result, data.subgraphs.answer_ptr, data.subgraphs.answers, config.eval.ks)
    return result, {key: float(values.mean()) for key, values in per_query.items()}
