"""Training throughput of the SeedER trainer: trajectories per second (M = 8, MetaQA config).

    python benchmarks/bench_train.py --artifacts /tmp/metaqa_art [--config configs/metaqa.yaml] [--steps 20]

Without ``--artifacts`` it times a synthetic task of the same shape (bounded subgraphs of ``--nodes``
nodes). Two figures, measured in the same run on the same queries:

- batched: the trainer as it runs (all M trajectories of all queries of a minibatch as one graph per
  expansion step, forward + backward + optimiser step);
- reference: the same work one trajectory at a time (a Python loop over queries and trajectories),
  which is what a straightforward implementation does. The ratio is the batching speed-up.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from seeder.config import load_config, training_config, SeederConfig  # noqa: E402
from seeder.losses import bpr_loss, reinforce_loss  # noqa: E402
from seeder.rollout import Rollout, recall_of_sets  # noqa: E402
from seeder.inference import QueryData  # noqa: E402
from seeder.synth import toy_task  # noqa: E402
from seeder.train import build_state, steps_per_epoch, train_step, trainable_queries  # noqa: E402


def load(args) -> tuple[QueryData, SeederConfig, str]:
    if args.artifacts:
        from seeder.artifacts import open_artifacts

        artifacts = open_artifacts(args.artifacts)
        config = training_config(artifacts.config, args.config, args.overrides)
        return QueryData.from_artifacts(artifacts, "train"), config, str(args.artifacts)
    data = toy_task(512, args.nodes, 256, num_relations=9, seed=0)
    return data, load_config(args.config, args.overrides), f"synthetic ({args.nodes} nodes per query)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", help="preprocessing artifacts (MetaQA); default: a synthetic task")
    parser.add_argument("--config", help="YAML config with model/train keys")
    parser.add_argument("--steps", type=int, default=20, help="timed optimisation steps (after 2 warm-up steps)")
    parser.add_argument("--reference-queries", type=int, default=8, help="queries timed one trajectory at a time")
    parser.add_argument("--nodes", type=int, default=200, help="subgraph size of the synthetic task")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.batch_size=32")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data, config, source = load(args)
    cfg = config.train
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    pool = np.random.default_rng(0).permutation(trainable_queries(data, config))
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32))
    batches = [pool[i * cfg.batch_size : (i + 1) * cfg.batch_size] for i in range(args.steps + 2)]
    sizes = data.subgraphs.sizes[pool[: cfg.batch_size * args.steps]]
    edges = np.diff(data.subgraphs.edge_ptr)[pool[: cfg.batch_size * args.steps]]
    print(f"data: {source}; subgraph nodes mean {sizes.mean():.0f}, induced edges mean {edges.mean():.0f}")
    print(f"config: M={cfg.num_trajectories} batch={cfg.batch_size} expansion_sizes={cfg.expansion_sizes} "
          f"frontier_caps={cfg.frontier_caps} hidden={config.model.hidden_dim} layers={config.model.num_layers} "
          f"threads={torch.get_num_threads()}")

    for index in batches[:2]:  # warm-up
        train_step(state, data.batch(index), relation_features)
    start = time.perf_counter()
    load_seconds = 0.0
    for index in batches[2:]:
        t0 = time.perf_counter()
        batch = data.batch(index)
        load_seconds += time.perf_counter() - t0
        train_step(state, batch, relation_features)
    batched_seconds = time.perf_counter() - start
    trajectories = args.steps * cfg.batch_size * cfg.num_trajectories
    batched_rate = trajectories / batched_seconds
    print(f"batched:   {trajectories} trajectories in {batched_seconds:.2f} s = {batched_rate:.0f} trajectories/s "
          f"({batched_seconds / args.steps * 1000:.0f} ms per step, batch building {load_seconds / args.steps * 1000:.0f} ms)")

    # Reference: one trajectory at a time, same model, same losses.
    model = state.model
    model.train()
    generator = torch.Generator().manual_seed(0)
    reference = pool[: args.reference_queries]
    start = time.perf_counter()
    for q in reference:
        batch = data.batch(np.array([q]))
        for _ in range(cfg.num_trajectories):
            rollout = Rollout(model, batch, relation_features, copies=1)
            out = rollout.run(cfg.expansion_sizes, cfg.frontier_caps, torch.zeros(1, dtype=torch.bool), cfg.temperature, generator)
            reward = recall_of_sets(out.selected, batch, 1)
            loss = reinforce_loss(out.log_prob, reward) + cfg.bpr_weight * bpr_loss(out.scores, out.selected, batch.is_answer)
            state.optimizer.zero_grad()
            loss.backward()
            state.optimizer.step()
    reference_seconds = time.perf_counter() - start
    reference_rate = len(reference) * cfg.num_trajectories / reference_seconds
    print(f"reference: {len(reference) * cfg.num_trajectories} trajectories one at a time in {reference_seconds:.2f} s "
          f"= {reference_rate:.0f} trajectories/s")
    print(f"speed-up of batching: {batched_rate / reference_rate:.1f}x; target >= 500 trajectories/s on a 2-core CPU: "
          f"{'met' if batched_rate >= 500 else 'NOT met'} ({batched_rate:.0f})")


if __name__ == "__main__":
    main()
