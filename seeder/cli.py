"""The ``seeder`` command. Each subcommand lives next to the code it drives and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from seeder.config import ConfigError, describe
from seeder.io import DataError

# Modules exposing ``register(subparsers)``; each adds its subcommands with ``set_defaults(func=...)``.
COMMAND_MODULES = [
    "seeder.importers.cli",  # seeder import stark|metaqa|triples
    "seeder.synth",  # seeder synth
    "seeder.evaluate",  # seeder evaluate, seeder retrieve
    "seeder.benchmark",  # seeder benchmark
    "seeder.retriever",  # seeder retrieve (new questions, a trained SeedER model)
    "seeder.tracking",  # seeder ui
]


def _info(args: argparse.Namespace) -> int:
    from seeder.store import open_dataset, summarize

    summary = summarize(open_dataset(args.dataset))
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


def _config(args: argparse.Namespace) -> int:
    from seeder.config import load_config, to_dict

    if args.file or args.overrides:
        import yaml

        print(yaml.safe_dump(to_dict(load_config(args.file, args.overrides)), sort_keys=False))
    else:
        print("\n".join(describe()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seeder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print node, relation, edge and query counts of a dataset")
    info.add_argument("dataset", help="dataset directory (from `seeder import` or `seeder synth`)")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_info)
    config = sub.add_parser("config", help="print every config key with its default and meaning, or a resolved config")
    config.add_argument("--file", help="YAML config to resolve")
    config.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4")
    config.set_defaults(func=_config)
    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DataError, ConfigError, FileExistsError, FileNotFoundError) as exc:
        print(f"seeder {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
