"""Preprocessing throughput: Ray Data embedding vs. the bare encoder, and the whole job at scale.

Part 1 (``--texts``, default 20,000): the same texts (MetaQA entity names when ``--metaqa`` points at
the data, else synthetic entity-like names) are embedded twice in one run, with the bare encoder in
this process (torch on every core) and through the job's own Ray Data pipeline
(``pipelines.preprocess.embedding_dataset``), its pool sized as the job sizes it (``embed_pool``: by
default one single-threaded actor per core). It prints texts/s for each and their ratio (goal >= 0.95
with MiniLM on 100K texts, ``--texts 100000``). Model loading is excluded from the bare figure and
included in the Ray Data one (actors load their model while the pipeline runs), which is what a real
job pays.

Part 2 (``--graph-nodes``, default 1M; 0 skips it): a relation-tracing synthetic graph
(``seeder.generate.synth``) with ``--graph-relations`` permutations (10 gives 10M edges) and ``--queries``
queries goes through the whole job with the hash encoder in a subprocess. It prints the wall time
(goal < 10 min at 1M nodes, 10M edges, 20K queries), the peak resident memory of the job's process
tree, Ray workers included (goal < 8 GB), each stage's throughput from ``summary.json``, and
subgraphs per second per core of the expansion stage.

Usage:
    python benchmarks/bench_preprocess.py --texts 2000 --graph-nodes 20000 --queries 2000   # quick
    python benchmarks/bench_preprocess.py --metaqa ../shared/data/metaqa                    # full
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from measure import REPO, run_measured  # noqa: E402


def bench_texts(count: int, metaqa: Path | None) -> list[str]:
    """MetaQA entity names (heads and tails of kb.txt, first seen first) or synthetic names."""
    if metaqa is not None and (metaqa / "kb.txt").is_file():
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(
            metaqa / "kb.txt",
            read_options=pcsv.ReadOptions(column_names=["h", "r", "t"]),
            parse_options=pcsv.ParseOptions(delimiter="|", quote_char=False),
            convert_options=pcsv.ConvertOptions(column_types={"h": pa.string(), "r": pa.string(), "t": pa.string()}),
        )
        names = pc.unique(pa.concat_arrays([table.column("h").combine_chunks(), table.column("t").combine_chunks()]))
        if len(names) >= count:
            return names.slice(0, count).to_pylist()
    from seeder.generate.synth import node_names

    return node_names(count, np.random.default_rng(0)).to_pylist()


def part_embedding(args) -> dict:
    import pyarrow as pa
    import ray
    import torch

    from pipelines.preprocess import embedding_dataset
    from seeder.config import EmbedConfig
    from seeder.features.embed import load_encoder

    texts = bench_texts(args.texts, args.metaqa)
    cfg = EmbedConfig(encoder=args.encoder, **({"cpus_per_actor": args.cpus_per_actor} if args.cpus_per_actor else {}))
    cpus = os.cpu_count() or 1
    torch.set_num_threads(cpus)
    encoder = load_encoder(cfg)
    encoder.encode(texts[:64])  # warm-up
    start = time.perf_counter()
    bare = encoder.encode(texts)
    bare_s = time.perf_counter() - start
    del encoder

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1")
    table = pa.table(
        {"kind": np.zeros(len(texts), np.int8), "row": np.arange(len(texts)), "id": np.arange(len(texts)), "text": texts}
    )
    start = time.perf_counter()
    ds, (actors, threads) = embedding_dataset(ray, table, cfg, 1024)
    ids, embs = [], []
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        ids.append(batch["id"])
        embs.append(np.asarray(batch["embedding"]))
    ray_s = time.perf_counter() - start
    ray.shutdown()
    ids = np.concatenate(ids)
    emb = np.concatenate(embs)[np.argsort(ids)]
    max_diff = float(np.abs(emb - bare).max())
    out = {
        "texts": len(texts),
        "encoder": args.encoder,
        "bare_texts_per_s": len(texts) / bare_s,
        "ray_data_texts_per_s": len(texts) / ray_s,
        "ratio": bare_s / ray_s,
        "max_abs_diff": max_diff,
    }
    print(
        f"embedding {len(texts):,} texts with {args.encoder}: bare {out['bare_texts_per_s']:,.0f} texts/s "
        f"({bare_s:.1f} s), Ray Data {out['ray_data_texts_per_s']:,.0f} texts/s ({ray_s:.1f} s, actor start included, {actors} actor(s) x {threads} thread(s)); "
        f"ratio {out['ratio']:.2f} (goal >= 0.95 on 100K texts); max |difference| {max_diff:.2e}"
    )
    return out


def part_job(args) -> dict:
    from seeder.generate.synth import SynthConfig, synthesize

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_pre_"))
    dataset = work / f"synth_{args.graph_nodes}"
    if not (dataset / "manifest.json").exists():
        start = time.perf_counter()
        synthesize(
            SynthConfig(nodes=args.graph_nodes, relations=args.graph_relations, queries=args.queries, max_path_length=2),
            dataset,
            overwrite=True,
        )
        print(
            f"synthetic graph: {args.graph_nodes:,} nodes, about {args.graph_nodes * args.graph_relations:,} edges, "
            f"{args.queries:,} queries written in {time.perf_counter() - start:.1f} s"
        )
    out = work / f"art_{args.graph_nodes}"
    if out.exists() and not args.keep:
        import shutil

        shutil.rmtree(out)
    cmd = [
        sys.executable,
        str(REPO / "pipelines" / "preprocess.py"),
        "--dataset",
        str(dataset),
        "--out",
        str(out),
        "--ray-address",
        "local",
        "embed.encoder=hash",
        "seed.strategy=dense",
        "expand.relation_score=cosine",
        *args.overrides,
    ]
    code, wall, peak, lines = run_measured(cmd)
    if code != 0:
        print("".join(lines[-40:]))
        raise SystemExit(f"the job failed with exit code {code}")
    summary = json.loads((out / "summary.json").read_text())
    cores = os.cpu_count() or 1
    sub = summary["stages"]["subgraphs"]
    result = {
        "nodes": summary["counts"]["nodes"],
        "edges": summary["counts"]["edges"],
        "queries": summary["counts"]["queries"],
        "wall_s": wall,
        "peak_rss_gb": peak / 1e9,
        "stages": {
            k: {"seconds": v["seconds"], "per_second": v["per_second"], "unit": v["unit"]} for k, v in summary["stages"].items()
        },
        "subgraphs_per_s_per_core": sub["items"] / sub["seconds"] / cores,
        "ceiling": summary["ceiling"]["all"]["all"],
    }
    print(
        f"full job: {result['nodes']:,} nodes, {result['edges']:,} edges, {result['queries']:,} queries in "
        f"{wall:.1f} s (goal < 600 s at 1M/10M/20K); peak memory {result['peak_rss_gb']:.2f} GB (goal < 8 GB)"
    )
    for name, stage in result["stages"].items():
        print(f"  {name:9s} {stage['seconds']:8.1f} s  {stage['per_second']:>12,.0f} {stage['unit']}/s")
    print(
        f"  expansion inside the job: {result['subgraphs_per_s_per_core']:,.0f} subgraphs/s/core ({cores} cores); "
        f"ceiling hit_any {result['ceiling']['hit_any']:.3f}"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=20_000, help="texts of the embedding comparison (0 skips it)")
    parser.add_argument("--encoder", default="minilm", help="encoder of the embedding comparison: minilm or hash")
    parser.add_argument(
        "--cpus-per-actor", type=float, default=0, help="embed.cpus_per_actor of the Ray Data run (0: the config default)"
    )
    parser.add_argument(
        "--metaqa",
        type=Path,
        default=REPO.parent / "shared" / "data" / "metaqa",
        help="MetaQA folder whose entity names are the texts (synthetic names when absent)",
    )
    parser.add_argument("--graph-nodes", type=int, default=1_000_000, help="nodes of the full-job graph (0 skips it)")
    parser.add_argument("--graph-relations", type=int, default=10, help="permutation relations: N edges each")
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--workdir", help="where the synthetic graph and artifacts go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep existing artifacts (measures a resumed run)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("overrides", nargs="*", help="config overrides of the full job, e.g. expand.budget=150")
    args = parser.parse_args()
    figures = {}
    if args.texts:
        figures["embedding"] = part_embedding(args)
    if args.graph_nodes:
        figures["job"] = part_job(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
