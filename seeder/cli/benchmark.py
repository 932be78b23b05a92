"""``seeder benchmark``: every retrieval method on one split, reported in the layout of the paper's Table 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from seeder.cli.arguments import add_accept_mismatch_argument, add_method_argument, add_split_argument
from seeder.config import with_overrides
from seeder.evaluation.benchmark import (
    DEFAULT_BUDGETS,
    REPORT_FILES,
    REPORT_MARKER,
    budget_curves,
    log_to_mlflow,
    run_benchmark,
    write_report,
)
from seeder.evaluation.evaluate import resolve_methods
from seeder.preprocessing.artifacts import open_artifacts
from seeder.retrieve.base import RetrievalResult
from seeder.system.io import check_replaceable
from seeder.system.storage import basename


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, ray_ranker: Callable[..., dict[str, tuple[RetrievalResult, float]]] | None = None) -> int:
    """``seeder benchmark``: the arguments of ``add_arguments``; ``pipelines/benchmark.py`` passes its
    Ray ranker (see ``run_benchmark``)."""
    methods = resolve_methods(args.methods, args.model)
    out = Path(args.out or Path("runs") / "benchmark" / f"{basename(args.artifacts)}-{args.split}")
    check_replaceable(out, overwrite=True, marker=REPORT_MARKER)  # before the work, not after it
    artifacts = open_artifacts(args.artifacts, accept_mismatch=getattr(args, "accept_mismatch", False))
    artifacts.dataset  # noqa: B018 -- a dataset rewritten since preprocessing fails here, before any ranking
    config = with_overrides(artifacts.config, args.overrides)
    report = run_benchmark(
        artifacts,
        methods,
        args.split,
        config,
        model=args.model,
        max_queries=args.max_queries,
        latency_queries=args.latency_queries,
        block_queries=args.block_queries,
        seed=args.seed,
        ray_ranker=ray_ranker,
    )
    report["artifacts"] = str(args.artifacts)  # as given: a URI rather than its local cache
    if args.budgets != "none":
        budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
        _say(f"budget curves: Dense and K-hop on {args.budget_queries} sampled queries, budgets {budgets}")
        report["budget"] = budget_curves(artifacts, args.split, config, budgets, args.budget_queries, args.seed)
    write_report(report, out)
    print((out / "table1.md").read_text())
    _say(f"wrote {', '.join(n for n in REPORT_FILES if (out / n).exists())} to {out}")
    if args.experiment != "none":
        run_id = log_to_mlflow(report, out, args.experiment)
        _say(f"MLflow run {run_id} in experiment {args.experiment!r}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``seeder benchmark``, shared with ``python pipelines/benchmark.py``."""
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory or URI (s3://, file://)")
    add_method_argument(parser, ["all"])
    add_split_argument(parser)
    parser.add_argument("--model", help="trained SeedER checkpoint; with it, 'all' includes method seeder")
    parser.add_argument(
        "--out",
        help="report directory (default runs/benchmark/ARTIFACTS-SPLIT); a previous report there is "
        "replaced as a whole, any other non-empty directory is refused",
    )
    parser.add_argument(
        "--max-queries",
        type=int,
        help="seeded sample of at most this many queries, stratified by the first attribute (default: every query of the split)",
    )
    parser.add_argument("--latency-queries", type=int, default=30, help="queries timed one at a time per method")
    parser.add_argument("--block-queries", type=int, default=256, help="queries per batched call")
    parser.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="budget grid of the plot, or 'none'")
    parser.add_argument("--budget-queries", type=int, default=200, help="sampled queries of the budget plot")
    parser.add_argument("--seed", type=int, default=0, help="seed of the query samples")
    parser.add_argument("--experiment", default="benchmark", help="MLflow experiment ('none' skips logging)")
    add_accept_mismatch_argument(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.ranking_length=200")


class _RanksOnRay(argparse.Action):
    """The Ray options moved to the Ray entry point; say where instead of 'unrecognized arguments'."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string}: ranking on Ray is `python pipelines/benchmark.py` with the same arguments "
            "(plus --ray-address and --num-cpus)"
        )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "benchmark",
        help="run every retrieval method on a split; Table-1 report (Markdown, CSV), budget plot, MLflow run",
        description=__doc__,
    )
    add_arguments(parser)
    parser.add_argument("--ray", "--ray-address", "--num-cpus", nargs="?", action=_RanksOnRay, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
