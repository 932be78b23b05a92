"""``seeder config``: every config key with its default and meaning, or a resolved config."""

from __future__ import annotations

import argparse

import yaml

from seeder.config import describe, load_config, to_dict


def run(args: argparse.Namespace) -> int:
    if args.file or args.overrides:
        print(yaml.safe_dump(to_dict(load_config(args.file, args.overrides)), sort_keys=False))
    else:
        print("\n".join(describe()))
    return 0


def register(sub) -> None:
    parser = sub.add_parser("config", help="print every config key with its default and meaning, or a resolved config")
    parser.add_argument("--file", help="YAML config to resolve")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4")
    parser.set_defaults(func=run)
