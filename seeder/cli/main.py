"""The ``seeder`` command: one module of this package per subcommand, each with ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from seeder.cli import benchmark, config, evaluate, imports, info, mcp, questions, retrieve, serve, synth, ui
from seeder.cli.arguments import Parser
from seeder.config import ConfigError
from seeder.system.io import DataError

COMMANDS = [info, config, imports, synth, questions, evaluate, benchmark, retrieve, serve, mcp, ui]
"""In the order ``seeder --help`` lists them."""


def version() -> str:
    try:
        return importlib.metadata.version("seeder")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH that was never installed
        return "unknown (not installed; pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="seeder", description="SeedER: learned seed-and-expand retrieval over knowledge graphs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # every option belongs to the serve entry point, --help included
        return serve.run(argparse.Namespace(serve_args=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DataError, ConfigError, FileExistsError, FileNotFoundError) as exc:
        print(f"seeder {args.command}: error: {exc}", file=sys.stderr)
        return 2
