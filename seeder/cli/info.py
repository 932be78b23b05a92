"""``seeder info``: node, relation, edge and query counts of a dataset."""

from __future__ import annotations

import argparse
import json

from seeder.data.store import open_dataset, summarize


def run(args: argparse.Namespace) -> int:
    summary = summarize(open_dataset(args.dataset))
    summary["path"] = str(args.dataset)  # as given: a URI rather than its local cache
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"dataset   {summary['path']}")
    print(f"nodes     {summary['nodes']:,}")
    print(f"relations {summary['relations']} (+{summary['relations']} inverse = {summary['relations_with_inverses']})")
    print(f"edges     {summary['edges']:,}")
    print("node types: " + ", ".join(f"{k} {v:,}" for k, v in sorted(summary["node_types"].items())))
    print("edges per relation: " + ", ".join(f"{k} {v:,}" for k, v in summary["edges_per_relation"].items()))
    for split, entry in summary["queries"].items():
        extra = "".join(
            f"; {attr}: " + ", ".join(f"{k}={v:,}" for k, v in sorted(counts.items()))
            for attr, counts in entry.items()
            if attr != "queries"
        )
        print(f"queries {split:5s} {entry['queries']:,}{extra}")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("info", help="print node, relation, edge and query counts of a dataset")
    parser.add_argument("dataset", help="dataset directory or URI (from `seeder import` or `seeder synth`)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)
