"""The seeds stage at scale: exact blocked top-k against the ANN index (``seed.search``), same run.

Features (``--features``):

- ``hash`` (default): the synthetic graph's node and question texts (``seeder.generate.synth``) through the hash
  encoder and the PCA of the features stage, as ``benchmarks/bench_million.py`` preprocesses them;
- ``clustered``: a mixture of tight Gaussian clusters with questions near nodes, the easy case for an
  inverted file, for contrast.

It times exact search (``dense_seeds`` with the config's block sizes, the stage's reference) over every
question, screened in float32 and in bfloat16 (``seed.screen``; the seeds must be identical), then the index: build (training and adding every node) once, and search at each ``--nprobe``.
For each it prints build, search and total seconds, the speed ratio exact / ANN counting the build,
and top-k0 recall against exact (share of the exact top-k0 ids found) and identical rows. Goal at 1M
nodes and 20K questions: ANN >= 10x faster with the build, recall >= 0.99.

    python benchmarks/bench_seeds.py                                  # 1M nodes, 20K questions, hash
    python benchmarks/bench_seeds.py --features clustered --nprobe 4,16
    python benchmarks/bench_seeds.py --nodes 100000 --queries 4000     # quick look
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from seeder.config import SeedConfig
from seeder.features.bert import native_bfloat16
from seeder.retrieve.ann import AnnIndex, topk_recall
from seeder.retrieve.seeds import dense_seeds


def hash_features(nodes: int, queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Node and question features as the pipeline makes them with ``embed.encoder=hash``."""
    from seeder.config import SynthConfig
    from seeder.features.embed import HashEncoder, apply_pca, fit_pca
    from seeder.generate.synth import generate

    node_table, _, _, query_table = generate(
        SynthConfig(nodes=nodes, relations=10, queries=queries, hubs=0, max_path_length=2, seed=seed)
    )
    encoder = HashEncoder(dim=384)
    texts = node_table.column("text")
    block = 100_000
    raw = np.concatenate([encoder.encode(texts.slice(i, block).to_pylist()) for i in range(0, nodes, block)])
    pca = fit_pca(raw, dim, 100_000, seed)
    return apply_pca(raw, pca), apply_pca(encoder.encode(query_table.column("text").to_pylist()), pca)


def clustered_features(nodes: int, queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """sqrt(N) Gaussian clusters of spread 0.2 around unit centres; questions at 0.1 from random nodes."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((int(np.sqrt(nodes)), dim), dtype=np.float32) / np.float32(np.sqrt(dim))
    out = np.empty((nodes, dim), dtype=np.float32)
    for lo in range(0, nodes, 200_000):
        rows = min(200_000, nodes - lo)
        x = centres[rng.integers(0, len(centres), rows)] + rng.standard_normal((rows, dim), dtype=np.float32) * np.float32(
            0.2 / np.sqrt(dim)
        )
        out[lo : lo + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    q = out[rng.integers(0, nodes, queries)] + rng.standard_normal((queries, dim), dtype=np.float32) * np.float32(
        0.1 / np.sqrt(dim)
    )
    return out, q / np.linalg.norm(q, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--features", choices=["hash", "clustered"], default="hash")
    parser.add_argument("--dim", type=int, default=256, help="PCA dimension (reduce.dim)")
    parser.add_argument("--k0", type=int, default=SeedConfig().k0)
    parser.add_argument("--nlist", type=int, default=0, help="index lists (0: seed.ann_nlist_factor * sqrt(N))")
    parser.add_argument("--nprobe", default="8,32", help="comma-separated lists scanned per question, one search each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = SeedConfig(k0=args.k0, search="ann", ann_nlist=args.nlist)

    start = time.perf_counter()
    make = hash_features if args.features == "hash" else clustered_features
    nodes, queries = make(args.nodes, args.queries, args.dim, args.seed)
    print(
        f"{args.features} features: {len(nodes):,} nodes, {len(queries):,} questions, {nodes.shape[1]} dims, "
        f"made in {time.perf_counter() - start:.1f} s; {os.cpu_count()} cores"
    )

    start = time.perf_counter()
    exact_ids, exact_scores = dense_seeds(queries, nodes, cfg.k0, cfg.block_nodes, cfg.block_queries, screen="float32")
    exact_s = time.perf_counter() - start
    print(f"exact, float32 screen:  {exact_s:7.2f} s  (blocks of {cfg.block_queries} questions x {cfg.block_nodes:,} nodes)")
    start = time.perf_counter()
    bf16_ids, bf16_scores = dense_seeds(queries, nodes, cfg.k0, cfg.block_nodes, cfg.block_queries, screen="bfloat16")
    bf16_s = time.perf_counter() - start
    identical = np.array_equal(bf16_ids, exact_ids) and np.array_equal(bf16_scores, exact_scores)
    print(
        f"exact, bfloat16 screen: {bf16_s:7.2f} s  ({exact_s / bf16_s:.2f}x the float32 screen; seeds identical: "
        f"{identical}; native bfloat16 on this CPU: {native_bfloat16()})"
    )

    start = time.perf_counter()
    index = AnnIndex.build(nodes, cfg)
    build_s = time.perf_counter() - start
    p = index.params
    print(f"ANN build: {build_s:7.2f} s  ({p.index}, nlist {p.nlist:,}, trained on {p.train_rows:,} rows)")
    for nprobe in (int(x) for x in args.nprobe.split(",")):
        start = time.perf_counter()
        ids, scores = index.search(queries, cfg.k0, nprobe=nprobe, extra=cfg.ann_extra)
        search_s = time.perf_counter() - start
        total = build_s + search_s
        same = (ids == exact_ids).all(axis=1)
        worst = float(np.abs(scores[same] - exact_scores[same]).max()) if same.any() else 0.0
        print(
            f"ANN nprobe {nprobe:>4}: search {search_s:7.2f} s, total {total:7.2f} s, exact/ANN {exact_s / total:5.2f}x "
            f"(search alone {exact_s / search_s:5.2f}x), top-{cfg.k0} recall {topk_recall(ids, exact_ids):.4f}, "
            f"identical rows {same.mean():.4f}, max score difference on them {worst:.1e}"
        )
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
