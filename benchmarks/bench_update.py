"""Update preprocessing against a full run, on MetaQA (issue 47's target: the update at most a tenth of
the full run's time).

The MetaQA graph is imported without a held-back share of ``kb.txt`` (``--held``, default 2%) as the
parent version, and preprocessed in full. A change set then changes ``--triples`` (default 1%) of its
triples, half added from the held-back part and half removed at random, and edits the text of
``--nodes`` (default 1%) of its nodes; ``seeder import ... --update`` writes the new version. The new
version is preprocessed twice, in full and with ``--update`` from the parent's artifacts, each in its own
process (Ray started by each), one after the other. It prints both wall times, their ratio, each
stage's seconds and what the update recomputed. Everything is written under ``--work``; nothing under
the MetaQA folder or the repository changes.

With ``--million``, the graph is instead the 1M-node recipe of ``benchmarks/bench_million.py`` (its
``seeder synth`` parameters and preprocessing settings: hash encoder, dense seeds, 2 hops, cosine
relation score) and the change rewires ``--edges`` (default 0.1%) of its edges: half removed at random,
half added between random existing nodes (issue 47's target: the update at most 5% of the full run's
time). Each preprocessing runs on an embedded local Ray, as bench_million's does.

Usage:
    python benchmarks/bench_update.py --metaqa ../shared/data/metaqa --work /tmp/bench-update
    python benchmarks/bench_update.py --metaqa ../shared/data/metaqa --work /tmp/bench-update embed.encoder=minilm
    python benchmarks/bench_update.py --million --work /tmp/bench-update-1m [--million-nodes 1000000 --edges 0.001]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seeder.data.importers.metaqa import import_metaqa  # noqa: E402
from seeder.data.store import open_dataset  # noqa: E402
from seeder.data.update import update_dataset  # noqa: E402


def split_kb(metaqa: Path, root: Path, held: float, seed: int) -> list[str]:
    """A MetaQA folder at ``root`` whose kb.txt lacks a random ``held`` share of the triples (the
    question folders are linked); returns the held-back lines."""
    lines = list(dict.fromkeys(line for line in (metaqa / "kb.txt").read_text().splitlines() if line.count("|") == 2))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lines))
    cut = int(len(lines) * held)
    root.mkdir(parents=True, exist_ok=True)
    (root / "kb.txt").write_text("\n".join(lines[i] for i in np.sort(order[cut:])) + "\n")
    for hop in ("1-hop", "2-hop", "3-hop"):
        if not (root / hop).exists():
            os.symlink((metaqa / hop).resolve(), root / hop)
    return [lines[i] for i in np.sort(order[:cut])]


def change_set(parent: Path, held: list[str], out: Path, triples: float, nodes: float, seed: int) -> tuple[Path, Path]:
    """Parquet change files: ``triples`` of the parent's edges changed (half added from ``held``, half
    removed) and the texts of ``nodes`` of its nodes edited. Names several nodes share are left out."""
    kg = open_dataset(parent)
    rng = np.random.default_rng(seed + 1)
    names = np.asarray(kg.node_names.to_pylist(), dtype=object)
    unique, counts = np.unique(names, return_counts=True)
    shared = set(unique[counts > 1].tolist())
    rel_names = np.asarray(kg.relations.column("name").to_pylist(), dtype=object)
    edges = kg.table("edges")
    src, dst, rel = (edges.column(c).to_numpy() for c in ("src", "dst", "relation"))
    count = int(kg.num_edges * triples)
    ok = ~np.isin(names[src], list(shared)) & ~np.isin(names[dst], list(shared))
    removed = rng.choice(np.flatnonzero(ok), count // 2, replace=False)
    added = [line.split("|") for line in held if not ({line.split("|")[0], line.split("|")[2]} & shared)]
    added = [added[i] for i in rng.choice(len(added), count - count // 2, replace=False)]
    table = pa.table(
        {
            "head": list(names[src[removed]]) + [a[0] for a in added],
            "relation": list(rel_names[rel[removed]]) + [a[1] for a in added],
            "tail": list(names[dst[removed]]) + [a[2] for a in added],
            "op": ["remove"] * len(removed) + ["add"] * len(added),
        }
    )
    pq.write_table(table, out / "triples.parquet")
    candidates = np.flatnonzero(~np.isin(names, list(shared)))
    edited = rng.choice(candidates, int(kg.num_nodes * nodes), replace=False)
    pq.write_table(
        pa.table({"name": list(names[edited]), "text": [f"{n} (edited)" for n in names[edited]], "op": ["add"] * len(edited)}),
        out / "nodes.parquet",
    )
    return out / "triples.parquet", out / "nodes.parquet"


def rewired(parent: Path, out: Path, share: float, seed: int) -> Path:
    """A Parquet triples change set rewiring ``share`` of the parent's edges: half removed at random,
    half added between random existing nodes with relations drawn as often as the edges use them (no
    duplicate of an edge). Node names must be unique, as the synthetic graph's are."""
    kg = open_dataset(parent)
    rng = np.random.default_rng(seed + 2)
    names = np.asarray(kg.node_names.to_pylist(), dtype=object)
    rel_names = np.asarray(kg.relations.column("name").to_pylist(), dtype=object)
    edges = kg.table("edges")
    src, dst, rel = (edges.column(c).to_numpy() for c in ("src", "dst", "relation"))
    count = int(kg.num_edges * share)
    removed = rng.choice(len(src), count // 2, replace=False)
    n, r_count, want = np.int64(kg.num_nodes), np.int64(kg.num_relations), count - count // 2
    existing = (src.astype(np.int64) * r_count + rel) * n + dst
    u, r, v = (
        rng.integers(n, size=4 * want + 16),
        rel[rng.integers(len(rel), size=4 * want + 16)],
        rng.integers(n, size=4 * want + 16),
    )
    keys = (u * r_count + r) * n + v
    ok = (u != v) & ~np.isin(keys, existing)
    _, first = np.unique(keys[ok], return_index=True)
    pick = np.flatnonzero(ok)[np.sort(first)][:want]
    added = list(zip(u[pick].tolist(), r[pick].tolist(), v[pick].tolist()))
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "head": list(names[src[removed]]) + [names[u] for u, _, _ in added],
            "relation": list(rel_names[rel[removed]]) + [rel_names[r] for _, r, _ in added],
            "tail": list(names[dst[removed]]) + [names[v] for _, _, v in added],
            "op": ["remove"] * len(removed) + ["add"] * len(added),
        }
    )
    pq.write_table(table, out / "triples.parquet")
    return out / "triples.parquet"


def preprocess(dataset: Path, out: Path, config: str | None, overrides: list[str], *extra: str) -> float:
    """One preprocessing job in its own process; its wall seconds. Without ``config``, the defaults."""
    command = [sys.executable, str(REPO / "pipelines" / "preprocess.py"), "--dataset", str(dataset), "--out", str(out)]
    # A full run reads the config; an update takes its parent's.
    command += [*extra, *overrides] if extra else [*(["--config", config] if config else []), *overrides]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if result.returncode:
        sys.exit(f"preprocess failed ({' '.join(command)}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return seconds


def stage_seconds(artifacts: Path) -> dict[str, float]:
    stages = json.loads((artifacts / "summary.json").read_text())["stages"]
    return {name: entry["seconds"] for name, entry in stages.items()}


# benchmarks/bench_million.py's recipe: its synth parameters and preprocessing settings.
MILLION_SYNTH = ["--relations", "10", "--queries", "20000", "--hubs", "20", "--hub-degree", "100000", "--max-path-length", "2"]
MILLION_SETTINGS = [
    "embed.encoder=hash",
    "seed.strategy=dense",
    "expand.hops=2",
    "expand.keep_per_hop=[60,140]",
    "expand.relation_score=cosine",
]


def million(args: argparse.Namespace) -> None:
    """The ``--million`` mode: bench_million's graph, ``--edges`` of its edges rewired."""
    work = args.work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    synth = [str(Path(sys.executable).parent / "seeder"), "synth", "--out", str(work / "v1"), "--nodes", str(args.million_nodes)]
    subprocess.run([*synth, *MILLION_SYNTH], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    start = time.perf_counter()
    triples = rewired(work / "v1", work, args.edges, args.seed)
    counts = update_dataset(work / "v1", work / "v2", triples_path=triples)
    print(f"change: {json.dumps(counts)} (change set and import {time.perf_counter() - start:.1f} s)")
    settings = ["--ray-address", "local", *MILLION_SETTINGS, *args.overrides]
    parent_seconds = preprocess(work / "v1", work / "a1", None, settings)
    full_seconds = preprocess(work / "v2", work / "full", None, settings)
    update_seconds = preprocess(work / "v2", work / "a2", None, ["--ray-address", "local"], "--update", str(work / "a1"))
    report(work, parent_seconds, full_seconds, update_seconds)


def report(work: Path, parent_seconds: float, full_seconds: float, update_seconds: float) -> None:
    print(f"parent full run: {parent_seconds:.1f} s (not compared)")
    print(f"full run of the new version: {full_seconds:.1f} s, stages {stage_seconds(work / 'full')}")
    print(f"update run: {update_seconds:.1f} s, stages {stage_seconds(work / 'a2')}")
    print(f"ratio update / full: {update_seconds / full_seconds:.3f}")
    summary = json.loads((work / "a2" / "summary.json").read_text())
    print(f"recomputed: {json.dumps(summary['update']['recomputed'])}")
    print(f"of: {json.dumps(summary['counts'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metaqa", type=Path, help="MetaQA folder (kb.txt, 1-hop/, 2-hop/, 3-hop/)")
    parser.add_argument("--million", action="store_true", help="bench_million's 1M-node graph instead of MetaQA")
    parser.add_argument("--million-nodes", type=int, default=1_000_000, help="--million: nodes of the graph")
    parser.add_argument("--edges", type=float, default=0.001, help="--million: share of the edges rewired")
    parser.add_argument("--work", required=True, type=Path, help="scratch folder for the versions and artifacts")
    parser.add_argument("--config", default=str(REPO / "configs" / "metaqa.yaml"))
    parser.add_argument("--held", type=float, default=0.02)
    parser.add_argument("--triples", type=float, default=0.01)
    parser.add_argument("--nodes", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "overrides", nargs="*", default=["embed.encoder=hash"], help="config overrides (default: the hash encoder)"
    )
    args = parser.parse_args()
    if args.million:
        args.overrides = [o for o in args.overrides if o != "embed.encoder=hash"]
        return million(args)
    if args.metaqa is None:
        parser.error("give --metaqa FOLDER, or --million")
    work = args.work
    if work.exists():
        shutil.rmtree(work)
    held = split_kb(args.metaqa, work / "metaqa-v1", args.held, args.seed)
    import_metaqa(work / "metaqa-v1", work / "v1")
    triples, nodes = change_set(work / "v1", held, work, args.triples, args.nodes, args.seed)
    counts = update_dataset(work / "v1", work / "v2", triples_path=triples, nodes_path=nodes)
    print(f"change: {json.dumps(counts)}")
    parent_seconds = preprocess(work / "v1", work / "a1", args.config, args.overrides)
    full_seconds = preprocess(work / "v2", work / "full", args.config, args.overrides)
    update_seconds = preprocess(work / "v2", work / "a2", args.config, [], "--update", str(work / "a1"))
    report(work, parent_seconds, full_seconds, update_seconds)


if __name__ == "__main__":
    main()
