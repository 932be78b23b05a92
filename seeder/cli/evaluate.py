"""``seeder evaluate``: rank a split with one or more methods and print their metrics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seeder.cli.arguments import add_accept_mismatch_argument, add_method_argument, add_split_argument
from seeder.config import with_overrides
from seeder.evaluation.evaluate import DEFAULT_METHODS, format_table, resolve_methods, run_evaluation
from seeder.evaluation.versions import evaluate_against_trained_version
from seeder.preprocessing.artifacts import open_artifacts


def run(args: argparse.Namespace) -> int:
    methods = resolve_methods(args.methods, args.model)
    artifacts = open_artifacts(args.artifacts, accept_mismatch=args.accept_mismatch)
    artifacts.dataset  # noqa: B018 -- a dataset rewritten since preprocessing fails here, before any ranking
    config = with_overrides(artifacts.config, args.overrides)
    report = run_evaluation(artifacts, methods, args.split, config, model=args.model, by=args.by)
    report["artifacts"] = str(args.artifacts)  # as given: a URI rather than its local cache
    print(format_table(report, config.eval.ks))
    if args.model:
        comparison = evaluate_against_trained_version(
            report,
            artifacts,
            args.model,
            args.baseline_artifacts,
            config.eval.ks,
            lambda other: run_evaluation(
                other, ["seeder"], args.split, with_overrides(other.config, args.overrides), model=args.model, by=args.by
            ),
        )
        if comparison:
            print(comparison)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="rank a split with one or more methods and print Hit@k, MRR, Recall@k, Hit/Recall@any, F1",
        description=__doc__,
    )
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory or URI (s3://, file://)")
    add_method_argument(parser, DEFAULT_METHODS)
    add_split_argument(parser)
    parser.add_argument("--json", help="also write the metrics as JSON to this file")
    parser.add_argument(
        "--by",
        action="append",
        help="query attribute to break results down by (repeatable; "
        "default: hop, else a question-type attribute with few values)",
    )
    parser.add_argument("--model", help="trained model checkpoint, for methods that need one (e.g. seeder)")
    parser.add_argument(
        "--baseline-artifacts",
        help="with --method seeder on an updated version of the model's graph: the artifacts of the version it "
        "was trained on, to evaluate it there too and print how far the metrics moved (default: where the model "
        "records them; 'none': no comparison)",
    )
    add_accept_mismatch_argument(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.ranking_length=200")
    parser.set_defaults(func=run)
