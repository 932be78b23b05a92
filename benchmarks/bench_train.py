"""Training throughput of the SeedER trainer: trajectories per second (M = 8, MetaQA config).

    python benchmarks/bench_train.py --artifacts /tmp/metaqa_art [--config configs/metaqa.yaml] [--steps 20]
    python benchmarks/bench_train.py --sample metaqa_sample.npz --device cuda --batch-sizes 8,256,1024

Without ``--artifacts`` it times a synthetic task of the same shape (bounded subgraphs of ``--nodes``
nodes). ``--save-sample FILE`` writes the queries a run times (their subgraphs, query features and the
rows of the node features they touch, in float16) to one file of a few MB, and ``--sample FILE`` times
them, so that a GPU machine can run the benchmark without the artifacts (300 MB on MetaQA). Two
figures, measured in the same run on the same queries:

- batched: the trainer as it runs (all M trajectories of all queries of a minibatch as one graph per
  expansion step, forward + backward + optimiser step);
- reference: the same work one trajectory at a time (a Python loop over queries and trajectories),
  which is what a straightforward implementation does. The ratio is the batching speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import fields, replace

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from seeder.config import SeederConfig, load_config, training_config  # noqa: E402
from seeder.data.subgraphs import SubgraphSet  # noqa: E402
from seeder.policy.inference import QueryData  # noqa: E402
from seeder.policy.losses import bpr_loss, reinforce_loss  # noqa: E402
from seeder.policy.rollout import Rollout, recall_of_sets  # noqa: E402
from seeder.policy.toy import toy_task  # noqa: E402
from seeder.training.loop import build_state, steps_per_epoch, train_step, trainable_queries  # noqa: E402


def save_sample(data: QueryData, index: np.ndarray, path: str) -> None:
    """The queries at ``index`` as one compressed file: their subgraphs with node ids renumbered to the
    rows they use, and those rows of the node features in float16 (timing does not depend on the last
    bits; the file is 1/4 of the float32 rows it replaces when few rows are used)."""
    part = data.subgraphs.take(index)
    used, inverse = np.unique(np.concatenate([part.nodes, part.answers]), return_inverse=True)
    arrays = {f.name: getattr(part, f.name) for f in fields(SubgraphSet)}
    arrays["nodes"] = inverse[: len(part.nodes)].astype(np.int32)
    arrays["answers"] = inverse[len(part.nodes) :].astype(np.int32)
    arrays["splits"] = np.asarray(part.splits, dtype=str)
    np.savez_compressed(
        path,
        node_features=np.asarray(data.node_features[used], dtype=np.float16),
        relation_features=np.asarray(data.relation_features, dtype=np.float32),
        query_features=np.asarray(data.query_features[index], dtype=np.float32),
        **{f"subgraphs.{k}": v for k, v in arrays.items()},
    )


def load_sample(path: str) -> QueryData:
    with np.load(path) as f:
        sub = {k.split(".", 1)[1]: f[k] for k in f.files if k.startswith("subgraphs.")}
        sub["splits"] = sub["splits"].astype(object)
        sub["nodes"] = sub["nodes"].astype(np.int64)
        sub["answers"] = sub["answers"].astype(np.int64)
        return QueryData(
            np.asarray(f["node_features"], dtype=np.float32), f["relation_features"], f["query_features"], SubgraphSet(**sub)
        )


def load(args) -> tuple[QueryData, SeederConfig, str]:
    if args.sample:
        return load_sample(args.sample), load_config(args.config, args.overrides), f"{args.sample} (saved queries)"
    if args.artifacts:
        from seeder.preprocessing.artifacts import open_artifacts

        artifacts = open_artifacts(args.artifacts)
        config = training_config(artifacts.config, args.config, args.overrides)
        return QueryData.from_artifacts(artifacts, "train"), config, str(args.artifacts)
    data = toy_task(512, args.nodes, 256, num_relations=9, seed=0)
    return data, load_config(args.config, args.overrides), f"synthetic ({args.nodes} nodes per query)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batched(
    data: QueryData, config: SeederConfig, pool: np.ndarray, steps: int, device: torch.device, profile: str | None = None
):
    """Trajectories/s of ``steps`` optimisation steps after 2 warm-up steps (the trainer as it runs)."""
    cfg = config.train
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    state.model.to(device)  # in place: the optimiser keeps the same parameters
    relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
    data = data.on(device)
    batches = [pool[(i * cfg.batch_size) % len(pool) :][: cfg.batch_size] for i in range(steps + 2)]
    for index in batches[:2]:  # warm-up (allocator, kernels, autotuning)
        train_step(state, data.batch(index).to(device), relation_features)
    synchronize(device)
    load_seconds = 0.0
    start = time.perf_counter()
    for index in batches[2:]:
        t0 = time.perf_counter()
        batch = data.batch(index).to(device)
        load_seconds += time.perf_counter() - t0
        train_step(state, batch, relation_features)
    synchronize(device)
    seconds = time.perf_counter() - start
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch_profile(activities=activities) as prof:
            for index in batches[2:5]:
                train_step(state, data.batch(index).to(device), relation_features)
            synchronize(device)
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        with open(profile, "a") as out:
            out.write(f"\n# batch_size={cfg.batch_size}, 3 steps\n")
            out.write(prof.key_averages().table(sort_by=sort, row_limit=45))
    trajectories = sum(len(index) for index in batches[2:]) * cfg.num_trajectories
    return trajectories / seconds, seconds / steps, load_seconds / steps, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", help="preprocessing artifacts (MetaQA); default: a synthetic task")
    parser.add_argument("--sample", help="a file written by --save-sample (instead of --artifacts)")
    parser.add_argument("--save-sample", help="write the timed queries to this file (.npz) and exit")
    parser.add_argument(
        "--sample-queries",
        type=int,
        default=0,
        help="queries --save-sample keeps (0: as many as the steps use; fewer are reused in turn)",
    )
    parser.add_argument("--config", help="YAML config with model/train keys")
    parser.add_argument("--steps", type=int, default=20, help="timed optimisation steps (after 2 warm-up steps)")
    parser.add_argument("--reference-queries", type=int, default=8, help="queries timed one trajectory at a time (0: skip)")
    parser.add_argument("--nodes", type=int, default=200, help="subgraph size of the synthetic task")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="torch device of the model and batches (cpu, cuda)")
    parser.add_argument(
        "--batch-sizes", default="", help="comma-separated train.batch_size values timed in turn (default: the config's)"
    )
    parser.add_argument("--profile", help="append a torch.profiler table of 3 steps per batch size to this file")
    parser.add_argument("--json", help="also write the batch sizes and their trajectories/s to this JSON file")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.batch_size=32")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data, config, source = load(args)
    cfg = config.train
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b] or [cfg.batch_size]
    pool = np.random.default_rng(0).permutation(trainable_queries(data, config))
    if args.save_sample:
        needed = args.sample_queries or max(batch_sizes) * (args.steps + 2)
        save_sample(data, np.sort(pool[:needed]), args.save_sample)
        print(f"wrote {min(needed, len(pool))} queries to {args.save_sample} ({os.path.getsize(args.save_sample) / 1e6:.1f} MB)")
        return
    shown = pool[: max(batch_sizes) * args.steps]
    sizes = data.subgraphs.sizes[shown]
    edges = np.diff(data.subgraphs.edge_ptr)[shown]
    print(
        f"data: {source}; {len(pool)} trainable queries; subgraph nodes mean {sizes.mean():.0f}, "
        f"induced edges mean {edges.mean():.0f}"
    )
    print(
        f"config: M={cfg.num_trajectories} expansion_sizes={cfg.expansion_sizes} frontier_caps={cfg.frontier_caps} "
        f"hidden={config.model.hidden_dim} layers={config.model.num_layers} device={device} "
        f"threads={torch.get_num_threads()}"
    )
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")

    state = None
    rates = []
    for batch_size in batch_sizes:
        sized = replace(config, train=replace(cfg, batch_size=batch_size))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            rate, step_seconds, load_seconds, state = time_batched(data, sized, pool, args.steps, device, args.profile)
        except torch.cuda.OutOfMemoryError:
            print(f"batched:   batch_size={batch_size}: out of GPU memory; larger batches skipped")
            torch.cuda.empty_cache()
            break
        memory = f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else ""
        print(
            f"batched:   batch_size={batch_size}: {rate:.0f} trajectories/s ({step_seconds * 1000:.0f} ms per step, batch building "
            f"{load_seconds * 1000:.0f} ms{memory})"
        )
        rates.append(rate)
    if not rates:
        raise SystemExit("no batch size fitted on the device; pass smaller --batch-sizes")
    batched_rate = rates[0]
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "source": source,
                    "threads": torch.get_num_threads(),
                    "device": str(device),
                    "batch_sizes": batch_sizes[: len(rates)],
                    "trajectories_per_second": rates,
                },
                out,
                indent=2,
            )

    if args.reference_queries > 0:
        # Reference: one trajectory at a time, same model, same losses.
        model = state.model
        model.train()
        relation_features = torch.tensor(np.asarray(data.relation_features, dtype=np.float32), device=device)
        generator = torch.Generator().manual_seed(0)
        reference = pool[: args.reference_queries]
        start = time.perf_counter()
        for q in reference:
            batch = data.batch(np.array([q])).to(device)
            for _ in range(cfg.num_trajectories):
                rollout = Rollout(model, batch, relation_features, copies=1)
                greedy = torch.zeros(1, dtype=torch.bool, device=device)
                out = rollout.run(cfg.expansion_sizes, cfg.frontier_caps, greedy, cfg.temperature, generator)
                reward = recall_of_sets(out.selected, batch, 1)
                loss = reinforce_loss(out.log_prob, reward) + cfg.bpr_weight * bpr_loss(out.scores, out.selected, batch.is_answer)
                state.optimizer.zero_grad()
                loss.backward()
                state.optimizer.step()
        synchronize(device)
        reference_seconds = time.perf_counter() - start
        reference_rate = len(reference) * cfg.num_trajectories / reference_seconds
        print(
            f"reference: {len(reference) * cfg.num_trajectories} trajectories one at a time in {reference_seconds:.2f} s "
            f"= {reference_rate:.0f} trajectories/s"
        )
        print(f"speed-up of batching (batch_size={batch_sizes[0]}): {batched_rate / reference_rate:.1f}x")
    target = 20_000 if device.type == "cuda" else 500
    best = max(rates)
    print(
        f"target >= {target} trajectories/s on {'a GPU' if device.type == 'cuda' else 'a 2-core CPU'}: "
        f"{'met' if best >= target else 'NOT met'} ({best:.0f}, batch_size={batch_sizes[rates.index(best)]})"
    )


if __name__ == "__main__":
    main()
