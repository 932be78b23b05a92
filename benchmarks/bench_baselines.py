"""Latency of every baseline retriever on a synthetic graph, against exact dense retrieval measured in the same run.

    python benchmarks/bench_baselines.py --nodes 100000
    python benchmarks/bench_baselines.py --nodes 1000000 --latency-queries 30

The graph is built in memory (no encoder): clustered random features, mostly intra-cluster edges
plus hubs, random word texts for BM25. Two figures per method:

- single query: each query alone, p50 and p95 milliseconds (methods interleaved query by query);
- batched: all ``--batch-queries`` queries in one call, milliseconds per query.

Every method computes a full ranking of ``--length`` nodes, whose dense fill is one exact scan over
all N node features: the ``dense`` row is that scan alone, and ``x dense`` is each method's ratio
to it (the cost the method adds on top of dense retrieval).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from seeder.config import BaselinesConfig
from seeder.evaluation.benchmark import percentile_ms, single_query_latency
from seeder.retrieve.baselines import METHODS, NEEDS_TEXT
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph, dense_topk
from seeder.retrieve.lexical import BM25Index


def synthetic_inputs(num_nodes: int, avg_degree: float, dim: int, num_queries: int, seed: int) -> BaselineInputs:
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    cluster_size = 50
    num_clusters = max(1, num_nodes // cluster_size)
    centres = rng.standard_normal((num_clusters, dim)).astype(np.float32)
    cluster = np.arange(num_nodes) // cluster_size % num_clusters
    features = centres[cluster] + 0.8 * rng.standard_normal((num_nodes, dim)).astype(np.float32)
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    num_edges = int(num_nodes * avg_degree / 2)
    src = rng.integers(0, num_nodes, num_edges)
    local = rng.random(num_edges) < 0.8
    dst = np.where(
        local, src - src % cluster_size + rng.integers(0, cluster_size, num_edges), rng.integers(0, num_nodes, num_edges)
    )
    dst = np.minimum(dst, num_nodes - 1)
    # Hubs: 0.01% of nodes get 2,000 extra edges each, so the neighbour caps are exercised.
    hubs = rng.choice(num_nodes, max(1, num_nodes // 10_000), replace=False)
    src = np.concatenate([src, np.repeat(hubs, 2_000)])
    dst = np.concatenate([dst, rng.integers(0, num_nodes, len(hubs) * 2_000)])
    num_relations = 20
    rel = rng.integers(0, num_relations, len(src))
    graph = InMemoryGraph.from_edges(num_nodes, num_relations, src, dst, rel)
    relations = rng.standard_normal((2 * num_relations, dim)).astype(np.float32)
    relations /= np.linalg.norm(relations, axis=1, keepdims=True)
    targets = rng.choice(num_nodes, num_queries, replace=False)
    queries = features[targets] + 0.5 * rng.standard_normal((num_queries, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    vocabulary = np.array([f"w{i}" for i in range(20_000)])
    words = rng.zipf(1.3, (num_nodes, 6)) % len(vocabulary)
    node_texts = [" ".join(row) for row in vocabulary[words].tolist()]
    query_texts = [" ".join(vocabulary[words[t, :3]].tolist()) for t in targets]
    print(
        f"graph: {num_nodes:,} nodes, {len(src):,} edges ({len(hubs)} hubs), dim {dim}, "
        f"{num_queries} queries; built in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return BaselineInputs(graph, features, relations, np.arange(num_queries, dtype=np.int64), queries, query_texts, node_texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--dim", type=int, default=256, help="feature dimension (the paper's PCA default)")
    parser.add_argument("--length", type=int, default=100, help="ranking length L")
    parser.add_argument("--latency-queries", type=int, default=50, help="queries timed one at a time")
    parser.add_argument("--batch-queries", type=int, default=256, help="queries in the batched run")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    total = max(args.latency_queries, args.batch_queries)
    inputs = synthetic_inputs(args.nodes, args.avg_degree, args.dim, total, args.seed)
    cfg = BaselinesConfig()

    if any(m in NEEDS_TEXT for m in methods):
        t0 = time.perf_counter()
        key = ("bm25", cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
        inputs.cache[key] = BM25Index.build(inputs.node_texts, cfg.bm25.k1, cfg.bm25.b, cfg.bm25.stopwords)
        print(f"BM25 index over {args.nodes:,} node texts: {time.perf_counter() - t0:.1f} s (once per dataset)", flush=True)

    def dense(batch: BaselineInputs) -> None:
        dense_topk(batch.query_features, batch.node_features, args.length)

    runners = {"dense": dense}
    runners.update({m: (lambda batch, m=m: METHODS[m](batch, cfg, args.length)) for m in methods})
    # Interleaved query by query (seeder.evaluation.benchmark.single_query_latency), so load from other
    # processes on the machine hits all methods alike and the ratios stay meaningful.
    names = list(runners)
    for name in names:
        runners[name](inputs.batch(np.arange(1)))  # warm-up: page in features, import paths
    batches = [inputs.batch(np.array([i])) for i in range(args.latency_queries)]
    single = single_query_latency(
        {name: (lambda i, name=name: runners[name](batches[i])) for name in names},
        list(range(args.latency_queries)),
        lambda done: (
            print(f"  single-query timing: {done}/{args.latency_queries} queries", flush=True) if done % 10 == 0 else None
        ),
    )
    batched: dict[str, float] = {}
    for name in names:
        batch = inputs.batch(np.arange(args.batch_queries))
        t0 = time.perf_counter()
        runners[name](batch)
        batched[name] = (time.perf_counter() - t0) / args.batch_queries
        print(f"  batched {name}: {batched[name] * 1000:.2f} ms/query", flush=True)
    rows = [(name, percentile_ms(single[name], 50), percentile_ms(single[name], 95), batched[name] * 1000.0) for name in names]

    ref_single, ref_batched = rows[0][1], rows[0][3]
    print()
    print(
        f"N = {args.nodes:,}, L = {args.length}, dim = {args.dim}; single: {args.latency_queries} queries one at a time; "
        f"batched: {args.batch_queries} queries per call"
    )
    print(f"{'method':<12} {'p50 ms':>9} {'p95 ms':>9} {'x dense':>8} {'batched ms/q':>13} {'x dense':>8}")
    for name, p50, p95, per_query in rows:
        print(f"{name:<12} {p50:>9.1f} {p95:>9.1f} {p50 / ref_single:>8.2f} {per_query:>13.2f} {per_query / ref_batched:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
