"""The learned SeedER retriever: method ``seeder`` of ``seeder evaluate`` and the ``seeder retrieve`` command.

``seeder evaluate --method seeder --model RUN/best.pt --artifacts A`` runs greedy rollouts
(Algorithm 1) over the artifacts' bounded subgraphs. ``seeder retrieve --model M --artifacts A
"question"`` answers one free-text question end to end: it embeds the question with the artifacts'
encoder and PCA, seeds it (``seed.strategy``), builds its bounded subgraph with
K-HOP-WITH-FILTERING, rolls the policy out, and prints the top k nodes with their names, scores and
the expansion step at which each was reached.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seeder.config import SeederConfig
from seeder.io import DataError
from seeder.retrieve import registry
from seeder.retrieve.base import RetrievalResult
from seeder.subgraphs import SubgraphSet


@dataclass
class LearnedRetriever:
    model: object  # seeder.model.SeedERPolicy
    model_config: SeederConfig
    node_features: np.ndarray
    relation_features: np.ndarray
    ranking_length: int

    def rank(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> tuple[RetrievalResult, np.ndarray, np.ndarray]:
        from seeder.train import TrainingData, retrieve

        data = TrainingData(self.node_features, self.relation_features, np.asarray(query_features, np.float32), subgraphs)
        return retrieve(self.model, data, self.model_config, self.ranking_length)

    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult:
        return self.rank(subgraphs, query_features)[0]


def model_checkpoint(model: str) -> Path:
    """The checkpoint file of a path, a ``runs:/`` URI or ``models:/NAME@champion`` (seeder.tracking);
    a model directory (the MLflow ``model/`` artifact) holds ``checkpoint.pt`` or ``best.pt``."""
    from seeder.tracking import resolve_model

    path = resolve_model(model)
    if path.is_dir():
        found = [path / name for name in ("checkpoint.pt", "best.pt") if (path / name).is_file()]
        if not found:
            raise DataError(f"model {model}: directory {path} holds no checkpoint.pt or best.pt")
        path = found[0]
    return path


def load_retriever(artifacts, config: SeederConfig, model: str | None) -> LearnedRetriever:
    from seeder.train import load_model

    if not model:
        raise DataError("method 'seeder' needs a trained model: pass --model RUN/best.pt (from python -m seeder.train)")
    policy, model_config = load_model(model_checkpoint(model))
    dim = int(artifacts.node_features.shape[1])
    if policy.feature_dim != dim:
        raise DataError(
            f"model {model} was trained on {policy.feature_dim}-dim features but {artifacts.path} has {dim}; "
            "use artifacts built with the same embed/reduce settings"
        )
    model_config = inference_schedule(model_config, config.eval.expansion_sizes, config.eval.frontier_caps)
    return LearnedRetriever(
        model=policy,
        model_config=model_config,
        node_features=artifacts.node_features,
        relation_features=np.asarray(artifacts.relation_features, np.float32),
        ranking_length=max(config.eval.ranking_length, int(config.seed.k0 + sum(model_config.train.expansion_sizes))),
    )


def inference_schedule(model_config: SeederConfig, sizes: list[int], caps: list[int]) -> SeederConfig:
    """The model's config with the expansion schedule of ``eval.expansion_sizes`` / ``eval.frontier_caps``
    (either empty: the model's training value). The weights do not depend on T or c_t, so a model
    trained with one budget can retrieve with another (Algorithm 1 takes c_t as an input)."""
    from seeder.train import check_schedule

    sizes = list(sizes) or list(model_config.train.expansion_sizes)
    caps = list(caps) or list(model_config.train.frontier_caps)
    check_schedule(sizes, caps, "eval")
    out = copy.deepcopy(model_config)
    out.train.expansion_sizes, out.train.frontier_caps = [int(c) for c in sizes], [int(c) for c in caps]
    return out


@registry.register("seeder")
def build_seeder(artifacts, config: SeederConfig, model: str | None = None) -> LearnedRetriever:
    return load_retriever(artifacts, config, model)


def question_subgraph(artifacts, question: str) -> tuple[SubgraphSet, np.ndarray]:
    """Embed, seed and expand one free-text question exactly as preprocessing did for the dataset."""
    from seeder.embed import PCA, apply_pca, load_encoder
    from seeder.retrieve.khop import expand_queries
    from seeder.retrieve.seeds import EntityLinker, dense_seeds, select_seeds

    config = artifacts.config
    encoder = load_encoder(config.embed, device="cpu")
    raw = encoder.encode([question])
    pca_path = Path(artifacts.path) / "features" / "pca.npz"
    query_features = apply_pca(raw, PCA.load(pca_path) if pca_path.is_file() else None)
    node_features = artifacts.node_features
    cfg = config.seed
    dense_ids, dense_scores = dense_seeds(query_features, node_features, cfg.k0, cfg.block_nodes, cfg.block_queries)
    linked = EntityLinker(artifacts.dataset, cfg).link([question]) if cfg.strategy != "dense" else None
    seeds, scores = select_seeds(cfg, dense_ids, dense_scores, linked, query_features, node_features)
    subgraphs = expand_queries(
        artifacts.dataset, node_features, artifacts.relation_features, query_features,
        np.asarray(seeds, np.int64), np.asarray(scores, np.float32), config.expand,
        np.array([-1], np.int64), np.array(["test"], dtype=object), np.zeros(2, np.int64), np.zeros(0, np.int64),
    )
    return subgraphs, query_features


def _retrieve_command(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from seeder.artifacts import open_artifacts

    artifacts = open_artifacts(args.artifacts)
    retriever = load_retriever(artifacts, artifacts.config, args.model)
    subgraphs, query_features = question_subgraph(artifacts, args.question)
    result, steps, scores = retriever.rank(subgraphs, query_features)
    ranked = result.ranking[0]
    keep = ranked >= 0
    ids, reached, score = ranked[keep][: args.k], steps[0][keep][: args.k], scores[0][keep][: args.k]
    names = artifacts.dataset.nodes.column("name").take(pa.array(ids)).to_pylist() if len(ids) else []
    in_set = np.arange(len(ids)) < result.set_size[0]
    print(f"question: {args.question}")
    print(f"{'rank':>4}  {'node':>8}  {'score':>8}  {'step':>4}  name")
    for i, (node, name, value, step, member) in enumerate(zip(ids, names, score, reached, in_set)):
        where = "seed" if step == 0 else (f"t={step}" if step > 0 else "-")
        note = "" if member else "   (outside the retrieved set; filter score)"
        print(f"{i + 1:>4}  {node:>8}  {value:>8.3f}  {where:>4}  {name}{note}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "retrieve", help="answer one question with a trained SeedER model: top k nodes, names, steps"
    )
    parser.add_argument("question", help="the question text")
    parser.add_argument("--model", required=True, help="checkpoint from python -m seeder.train (RUN/best.pt)")
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts of the graph to search")
    parser.add_argument("-k", type=int, default=10, help="nodes to print (default 10)")
    parser.set_defaults(func=_retrieve_command)
