"""The million-node recipe: a synthetic graph through synth, preprocess, train and evaluate on this machine.

Each stage runs as its own command, exactly as a user would run it (see README, "Scaling out"), with
the hash encoder so that embedding does not dominate. For each stage the script prints wall time and
peak memory (process tree, Ray included), then the cost per node and per query, and extrapolates
the preprocessing time to 10M nodes on a cluster from those measured per-node and per-query costs.

    python benchmarks/bench_million.py                              # 1M nodes, 10M edges, 20K queries
    python benchmarks/bench_million.py --nodes 1900000 --relations 10 --skip-train   # STaRK-MAG sized
    python benchmarks/bench_million.py --nodes 100000 --queries 4000                  # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from measure import REPO, run_measured

BIN = Path(sys.executable).parent
STAGE_LINE = re.compile(r"^(\w+): .* in [\d.]+ s \([\d,.]+ \S+/s\)")
"""The line preprocessing prints as each of its stages ends (``seeds: ... in 9.1 s (2,190 queries/s)``)."""


def stage_ended(line: str) -> str | None:
    match = STAGE_LINE.match(line)
    return match.group(1) if match else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--relations", type=int, default=10, help="permutation relations: edges = nodes x relations")
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--hubs", type=int, default=20, help="hub nodes with --hub-degree extra edges each")
    parser.add_argument("--hub-degree", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-queries", type=int, default=4_000, help="training queries per epoch (a sample)")
    parser.add_argument("--skip-train", action="store_true", help="stop after preprocessing (e.g. the MAG-sized run)")
    parser.add_argument(
        "--relation-score",
        choices=["cosine", "learned"],
        default="cosine",
        help="K-HOP-WITH-FILTERING's relation term (learned adds the golden-path and prior stages)",
    )
    parser.add_argument("--workdir", default="runs/million")
    parser.add_argument("--cluster-nodes", type=int, default=10_000_000, help="extrapolate preprocessing to this size")
    parser.add_argument("--cluster-cores", type=int, default=64, help="... on this many cores")
    args = parser.parse_args()

    work = Path(args.workdir) / f"n{args.nodes}-{args.relation_score}"
    dataset, artifacts, model = work / "dataset", work / "artifacts", work / "model"
    # The settings this recipe was measured with, not derived from the graph (see seeder.preprocessing.derive).
    env_overrides = [
        "embed.encoder=hash",
        "seed.strategy=dense",
        "expand.hops=2",
        "expand.keep_per_hop=[60,140]",
        f"expand.relation_score={args.relation_score}",
    ]
    stages = [
        (
            "synth",
            [
                str(BIN / "seeder"),
                "synth",
                "--out",
                str(dataset),
                "--overwrite",
                "--nodes",
                str(args.nodes),
                "--relations",
                str(args.relations),
                "--queries",
                str(args.queries),
                "--hubs",
                str(args.hubs),
                "--hub-degree",
                str(args.hub_degree),
                "--max-path-length",
                "2",
            ],
        ),
        (
            "preprocess",
            [
                sys.executable,
                str(REPO / "pipelines" / "preprocess.py"),
                "--dataset",
                str(dataset),
                "--out",
                str(artifacts),
                "--ray-address",
                "local",
                *env_overrides,
            ],
        ),
    ]
    if not args.skip_train:
        stages += [
            (
                "train",
                [
                    sys.executable,
                    str(REPO / "pipelines" / "train.py"),
                    "--artifacts",
                    str(artifacts),
                    "--out",
                    str(model),
                    "--num-workers",
                    "2",
                    "--experiment",
                    "million",
                    "--resume",
                    f"train.epochs={args.epochs}",
                    "train.warmup_epochs=0",
                    f"train.queries_per_epoch={args.train_queries}",
                ],
            ),
            (
                "evaluate",
                [
                    str(BIN / "seeder"),
                    "evaluate",
                    "--artifacts",
                    str(artifacts),
                    "--split",
                    "test",
                    "--method",
                    "dense",
                    "--method",
                    "khop",
                    "--method",
                    "seeder",
                    "--model",
                    str(model / "model"),
                    "--json",
                    str(work / "test_metrics.json"),
                ],
            ),
        ]
    if artifacts.exists():
        import shutil

        shutil.rmtree(artifacts)  # measure a cold preprocessing run, not a resumed one
    if model.exists():
        import shutil

        shutil.rmtree(model)
    results = {}
    for name, cmd in stages:
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        code, wall, peak, lines = run_measured(cmd, phase_end=stage_ended if name == "preprocess" else None)
        if code != 0:
            print("".join(lines[-40:]))
            raise SystemExit(f"{name} failed with exit code {code}")
        results[name] = {
            "seconds": wall,
            "peak_rss_gb": peak / 1e9,
            "peak_process_gb": run_measured.last_peak_process / 1e9,
            "peak_process_anon_gb": run_measured.last_peak_anon / 1e9,
            "peak_process": run_measured.last_peak_title,
            "phases": run_measured.last_phases,
        }

    manifest = json.loads((dataset / "manifest.json").read_text())
    counts = manifest["counts"]
    print(f"\ngraph: {counts['nodes']:,} nodes, {counts['edges']:,} edges, {counts['queries']:,} queries; {os.cpu_count()} cores")
    print(
        f"{'stage':12s} {'wall s':>9s} {'peak GB':>8s} {'1 process':>10s} {'anon':>6s}   (peak: RSS of all processes "
        "together; 1 process: the largest RSS; anon: the largest without file-backed shared pages)"
    )
    for name, r in results.items():
        print(
            f"{name:12s} {r['seconds']:9.1f} {r['peak_rss_gb']:8.2f} {r['peak_process_gb']:10.2f} {r['peak_process_anon_gb']:6.2f}"
            f"   largest: {r['peak_process']}"
        )
    summary = json.loads((artifacts / "summary.json").read_text())
    per_stage = summary["stages"]
    print("\npreprocessing stages (from summary.json):")
    for name, st in per_stage.items():
        print(f"  {name:10s} {st['seconds']:8.1f} s  {st['per_second']:>12,.0f} {st['unit']}/s")
    phases = {p["name"]: p for p in results["preprocess"]["phases"]}
    print(
        f"\npreprocessing stages, peak memory (GB) while each ran (sampled every 0.5 s; "
        f"'after' is the summary and ceilings):\n  {'stage':10s} {'wall s':>8s} {'all':>7s} {'1 process':>10s} {'anon':>6s}"
    )
    for name in [*per_stage, None]:
        phase = phases.get(name)
        if phase is None:
            continue
        seconds = f"{per_stage[name]['seconds']:8.1f}" if name in per_stage else f"{'':8s}"
        print(
            f"  {name or 'after':10s} {seconds} {phase['peak_rss'] / 1e9:7.2f} {phase['peak_process_rss'] / 1e9:10.2f} "
            f"{phase['peak_process_anon'] / 1e9:6.2f}   largest: {phase['peak_process_title']}"
        )
    print(
        f"  per-query subgraph cost: {1000 * per_stage['subgraphs']['seconds'] / counts['queries']:.3f} ms "
        f"(compare with another --nodes at the same --queries per core)"
    )
    # Extrapolation: embedding and the features stage's projection scale with texts or nodes, seeds with
    # queries x nodes (exact top-k), expansion with queries only (bounded subgraphs); all of them spread
    # over the cluster's cores (the PCA fit on its bounded sample is a constant).
    cores = os.cpu_count() or 1
    scale_nodes = args.cluster_nodes / counts["nodes"]
    core_ratio = args.cluster_cores / cores
    est = {
        "embed": per_stage["embed"]["seconds"] * scale_nodes / core_ratio,
        "features": per_stage["features"]["seconds"] * scale_nodes / core_ratio,
        "seeds": per_stage["seeds"]["seconds"] * scale_nodes / core_ratio,
        "subgraphs": per_stage["subgraphs"]["seconds"] / core_ratio,
    }
    print(
        f"\nextrapolated to {args.cluster_nodes:,} nodes ({args.relations} edges/node, same queries) on "
        f"{args.cluster_cores} cores, from the per-node and per-query costs above:"
    )
    for name, seconds in est.items():
        print(f"  {name:10s} {seconds / 60:8.1f} min")
    print(f"  total      {sum(est.values()) / 60:8.1f} min (hash encoder; MiniLM embedding runs on GPU actors)")
    if (work / "test_metrics.json").exists():
        print(f"\ntest metrics: {work / 'test_metrics.json'}")
    (work / "bench.json").write_text(json.dumps({"results": results, "counts": counts, "extrapolated_s": est}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
