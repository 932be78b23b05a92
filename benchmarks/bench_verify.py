"""Cost of verified artifacts against the preprocessing run that built them (goal: under 5%).

Three costs per stage directory of an artifacts directory:

    record   checksums, sizes and row counts of every file (``seeder.system.io.file_records``): what a stage
             pays once, when it commits, inside the preprocessing run
    deep     ``verify_outputs(deep=True)``: every file's checksum again, what a rerun pays per stage
             before it skips it
    cheap    ``verify_outputs(deep=False)``: existence and sizes, what every reader (evaluate, train,
             retrieve) pays when it opens the artifacts

each compared with the preprocessing time in the artifacts' ``summary.json`` (the wall time of the run
that built them, and the sum of its stage times). Artifacts written before file records existed are
measured too: their records are computed in memory (nothing is written into them).

Usage:
    python benchmarks/bench_verify.py --artifacts runs/demo/artifacts
    python benchmarks/bench_verify.py --nodes 50000 --queries 2000        # synthesize, preprocess, measure
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("embed", "features", "seeds", "paths", "prior", "subgraphs")


def build(args) -> Path:
    """A synthetic graph preprocessed with the hash encoder (the job's own command)."""
    from seeder.generate.synth import SynthConfig, synthesize

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_verify_"))
    dataset, out = work / f"synth_{args.nodes}", work / f"art_{args.nodes}"
    if not (dataset / "manifest.json").exists():
        synthesize(
            SynthConfig(nodes=args.nodes, relations=args.relations, queries=args.queries, max_path_length=2),
            dataset,
            overwrite=True,
        )
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
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"preprocessing failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return out


def timed(func, *args, **kwargs):
    start = time.perf_counter()
    value = func(*args, **kwargs)
    return value, time.perf_counter() - start


def measure(artifacts: Path, repeats: int) -> dict:
    from seeder.system.io import file_records, read_manifest, verify_outputs

    summary = json.loads((artifacts / "summary.json").read_text())
    rows, totals = [], {"bytes": 0, "files": 0, "record": 0.0, "deep": 0.0, "cheap": 0.0}
    for stage in STAGES:
        directory = artifacts / stage
        manifest = read_manifest(directory)
        if manifest is None:
            continue
        records, cold_s = timed(file_records, directory)  # the first read may come from disk
        record_s = min([cold_s] + [timed(file_records, directory)[1] for _ in range(repeats - 1)])
        recorded = manifest if isinstance(manifest.get("files"), dict) else {"files": records}
        deep_s = min(timed(verify_outputs, directory, recorded, True)[1] for _ in range(repeats))
        cheap_s = min(timed(verify_outputs, directory, recorded, False)[1] for _ in range(repeats))
        problems = verify_outputs(directory, recorded, deep=True)
        size = sum(entry["bytes"] for entry in records.values())
        entry = summary["stages"].get(stage, {})
        rows.append(
            {
                "stage": stage,
                "files": len(records),
                "bytes": size,
                "first_read_s": cold_s,
                "record_s": record_s,
                "deep_s": deep_s,
                "cheap_s": cheap_s,
                "stage_s": entry.get("seconds"),
                # what the run itself paid (recorded by runs that write file records)
                "in_run_record_s": manifest.get("record_seconds"),
                "problems": problems,
            }
        )
        for key, value in (("bytes", size), ("files", len(records)), ("record", record_s), ("deep", deep_s), ("cheap", cheap_s)):
            totals[key] += value
    in_run = [row["in_run_record_s"] for row in rows]
    totals["in_run_record"] = sum(in_run) if all(v is not None for v in in_run) else None
    wall = float(summary["wall_seconds"])
    stage_sum = sum(float(v["seconds"]) for v in summary["stages"].values())
    return {
        "artifacts": str(artifacts),
        "nodes": summary["counts"]["nodes"],
        "wall_s": wall,
        "stage_sum_s": stage_sum,
        "stages": rows,
        "totals": totals,
        "fraction_of_wall": {k: totals[k] / wall for k in ("record", "deep", "cheap")},
        "fraction_of_stage_sum": {k: totals[k] / stage_sum for k in ("record", "deep", "cheap")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", help="measure these artifacts (default: synthesize and preprocess a graph)")
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--relations", type=int, default=5)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--workdir", help="where the synthetic graph and artifacts go (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=3, help="deep and cheap checks: best of this many")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("overrides", nargs="*", help="config overrides of the preprocessing job")
    args = parser.parse_args(argv)
    artifacts = Path(args.artifacts) if args.artifacts else build(args)
    result = measure(artifacts, args.repeats)
    print(
        f"artifacts {result['artifacts']}: {result['nodes']:,} nodes, built in {result['wall_s']:.1f} s "
        f"(stages {result['stage_sum_s']:.1f} s)"
    )
    print(
        "record and deep: best of --repeats passes, files in the page cache as a stage's own files are when it "
        "commits (first read, possibly from disk: 1st read s)"
    )
    print(
        f"{'stage':10s} {'files':>6s} {'MB':>9s} {'1st read s':>10s} {'record s':>9s} {'deep s':>8s} {'cheap s':>8s} "
        f"{'stage s':>8s}"
    )
    for row in result["stages"]:
        print(
            f"{row['stage']:10s} {row['files']:>6d} {row['bytes'] / 1e6:>9.1f} {row['first_read_s']:>10.3f} {row['record_s']:>9.3f} "
            f"{row['deep_s']:>8.3f} {row['cheap_s']:>8.4f} {row['stage_s'] or 0:>8.1f}"
            + (f"  PROBLEMS: {row['problems'][:2]}" if row["problems"] else "")
        )
    t = result["totals"]
    print(
        f"{'total':10s} {t['files']:>6d} {t['bytes'] / 1e6:>9.1f} {'':>10s} {t['record']:>9.3f} {t['deep']:>8.3f} {t['cheap']:>8.4f}"
    )
    if t["in_run_record"] is not None:
        print(
            f"{'recording, as the run paid it':30s} {t['in_run_record']:7.3f} s = "
            f"{100 * t['in_run_record'] / result['wall_s']:5.2f}% of the run's wall time (manifests' record_seconds)"
        )
    for key, what in (
        ("record", "recording (once, at commit)"),
        ("deep", "deep verify (each rerun)"),
        ("cheap", "cheap verify (each reader)"),
    ):
        print(
            f"{what:30s} {t[key]:7.3f} s = {100 * result['fraction_of_wall'][key]:5.2f}% of the run's wall time, "
            f"{100 * result['fraction_of_stage_sum'][key]:5.2f}% of its stage time (goal < 5%)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
