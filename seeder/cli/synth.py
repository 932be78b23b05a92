"""``seeder synth``: write a synthetic relation-tracing graph as a dataset directory."""

from __future__ import annotations

import argparse
import dataclasses

from seeder.config import field_docs
from seeder.generate.synth import SynthConfig, load_synth_config, synthesize


def run(args: argparse.Namespace) -> int:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SynthConfig)}
    cfg = load_synth_config(args.config, overrides)
    synthesize(cfg, args.out, overwrite=args.overwrite)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "synth", help="write a synthetic relation-tracing graph (paper, Definition B.1) as a dataset directory"
    )
    parser.add_argument("--out", required=True, help="dataset directory to create")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument(
        "--config", help="config file whose `synth` section holds the parameters (e.g. configs/synth_default.yaml)"
    )
    docs = field_docs(SynthConfig)
    for f in dataclasses.fields(SynthConfig):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type={"int": int, "float": float}[str(f.type)],
            default=None,
            help=f"{docs.get(f.name, '')} (default {f.default})",
        )
    parser.set_defaults(func=run)
