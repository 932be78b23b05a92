"""The paper's Table 2b ablations on one dataset: train each variant with the same config, then score
them on the same split with ``seeder evaluate``, and print one Markdown table per hop.

    python benchmarks/bench_ablations.py --artifacts runs/metaqa/artifacts --config configs/metaqa.yaml \
        --out runs/ablations [--split val] [--only full,one_trajectory] [train.epochs=2 ...]

Variants (each the config plus overrides):

- ``full``: SeedER as configured;
- ``no_aux_loss``: no BPR ranking loss (``train.bpr_weight=0``): the final scores are not trained;
- ``one_trajectory``: M = 1 (``train.num_trajectories=1``, no baseline: a group of one has none);
- ``no_baseline``: M = 8 with raw rewards (``train.baseline=none``);
- ``greedy_baseline``: the greedy rollout's reward as the baseline (``train.baseline=greedy``);
- ``rerank``: the GNN scores the whole bounded subgraph, no learned expansion (``train.mode=rerank``).

Every variant is trained by ``pipelines/train.py`` (the one training command) into ``OUT/VARIANT`` and
evaluated at the config's ``eval`` budget; trailing ``KEY=VALUE`` overrides apply to all of them (a
shorter schedule, for example). A variant whose model exists is evaluated again without retraining.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from measure import run_logged

VARIANTS = {
    "full": [],
    "no_aux_loss": ["train.bpr_weight=0"],
    "one_trajectory": ["train.num_trajectories=1", "train.baseline=none"],
    "no_baseline": ["train.baseline=none"],
    "greedy_baseline": ["train.baseline=greedy"],
    "rerank": ["train.mode=rerank"],
}
COLUMNS = ("hit_at_1", "hit_at_5", "mrr", "recall_at_20", "hit_any", "set_size")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory")
    parser.add_argument("--config", help="YAML config every variant starts from")
    parser.add_argument("--out", required=True, help="one run directory per variant is made here")
    parser.add_argument("--split", default="val", help="split the variants are scored on")
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma list of variants to run")
    parser.add_argument("--num-workers", type=int, default=2, help="Ray Train workers per training run")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every variant, e.g. train.epochs=2")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "ablations.log"
    print(f"bench_ablations: {len(names)} variants; full output in {log}", flush=True)
    results: dict[str, dict] = {}
    for i, name in enumerate(names, 1):
        run_dir = out / name
        start = time.perf_counter()
        if not (run_dir / "model" / "seeder_model.json").exists():
            config = ["--config", args.config] if args.config else []
            run_logged(
                [
                    sys.executable,
                    "pipelines/train.py",
                    "--artifacts",
                    args.artifacts,
                    *config,
                    "--out",
                    str(run_dir),
                    "--num-workers",
                    str(args.num_workers),
                    "--experiment",
                    "ablations",
                    *args.overrides,
                    *VARIANTS[name],
                ],
                log,
            )
        trained = time.perf_counter() - start
        report = run_dir / f"{args.split}_metrics.json"
        run_logged(
            [
                sys.executable,
                "-m",
                "seeder.cli",
                "evaluate",
                "--artifacts",
                args.artifacts,
                "--split",
                args.split,
                "--method",
                "seeder",
                "--model",
                str(run_dir / "model"),
                "--json",
                str(report),
            ],
            log,
        )
        results[name] = {"report": json.loads(report.read_text())["methods"]["seeder"], "seconds": trained}
        print(
            f"[{i}/{len(names)}] {name}: hit@1 {results[name]['report']['all']['hit_at_1']:.3f} (trained in {trained:.0f} s)",
            flush=True,
        )
    groups = [g for g in next(iter(results.values()))["report"] if g == "all" or g.startswith("hop=")]
    lines = []
    for group in groups:
        lines += [
            f"\n{group} ({args.split})\n",
            "| variant | " + " | ".join(COLUMNS) + " | train s |",
            "|---|" + "---|" * (len(COLUMNS) + 1),
        ]
        for name, result in results.items():
            row = result["report"].get(group, {})
            cells = [f"{row[c]:.1f}" if c == "set_size" else f"{row[c]:.3f}" for c in COLUMNS if c in row]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {result['seconds']:.0f} |")
    table = "\n".join(lines)
    (out / "ablations.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
