"""The ``seeder`` command. Each subcommand lives next to the code it drives and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import sys

from seeder.config import ConfigError, describe
from seeder.io import DataError

# Modules exposing ``register(subparsers)``; each adds its subcommands with ``set_defaults(func=...)``.
COMMAND_MODULES = [
    "seeder.importers.cli",  # seeder import stark|metaqa|triples
    "seeder.synth",  # seeder synth
    "seeder.questions",  # seeder questions (training questions generated from a graph)
    "seeder.evaluate",  # seeder evaluate
    "seeder.benchmark",  # seeder benchmark
    "seeder.retriever",  # seeder retrieve (new questions, a trained SeedER model)
    "seeder.tracking",  # seeder ui
]


_RST = re.compile(r"``(.+?)``|\*\*(.+?)\*\*")


def plain(text: str) -> str:
    """Docstrings double as --help text: show their RST literals and bold as plain words."""
    return _RST.sub(lambda m: m.group(1) or m.group(2), text)


def _no_default(value) -> bool:
    # Identity, not ==: a default of 0 or 0.0 is worth showing, an unset one (None) or a flag's False is not.
    return value is None or value is False or value is argparse.SUPPRESS


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every command's help: descriptions keep their line breaks and lose RST markup, and each option
    shows its default unless its help already says it or there is none (None, a False flag)."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain(action.help or "")
        if _no_default(action.default) or "default" in text.lower() or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with ``HelpFormatter``, also for the subcommands that modules register."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse prints nothing, default included, for an option without help.
        if kwargs.get("help") is None and not _no_default(kwargs.get("default")) and str(args[0]).startswith("-"):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)


def positive_int(text: str) -> int:
    """argparse type of counts and sizes: an integer >= 1, refused while parsing (before any work)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def version() -> str:
    try:
        return importlib.metadata.version("seeder")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH that was never installed
        return "unknown (not installed; pip install -e .)"


def _info(args: argparse.Namespace) -> int:
    from seeder.store import open_dataset, summarize

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


def _config(args: argparse.Namespace) -> int:
    from seeder.config import load_config, to_dict

    if args.file or args.overrides:
        import yaml

        print(yaml.safe_dump(to_dict(load_config(args.file, args.overrides)), sort_keys=False))
    else:
        print("\n".join(describe()))
    return 0


SERVE_MODULE = "pipelines.serve"  # Ray Serve lives with the other Ray entry points; run, never imported


def _serve(args: argparse.Namespace) -> int:
    # Replace this process, so that Ctrl-C or a SIGINT reaches the server itself, which then shuts its
    # Ray down (a child killed by its parent would leave the embedded Ray running).
    os.execv(sys.executable, [sys.executable, "-m", SERVE_MODULE, *args.serve_args])
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="seeder", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    info = sub.add_parser("info", help="print node, relation, edge and query counts of a dataset")
    info.add_argument("dataset", help="dataset directory or URI (from `seeder import` or `seeder synth`)")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_info)
    config = sub.add_parser("config", help="print every config key with its default and meaning, or a resolved config")
    config.add_argument("--file", help="YAML config to resolve")
    config.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4")
    config.set_defaults(func=_config)
    serve = sub.add_parser("serve", help="serve a trained model over HTTP on Ray Serve (127.0.0.1 by default); "
                           "`seeder serve --help` lists its options", add_help=False)
    serve.add_argument("serve_args", nargs=argparse.REMAINDER, help="--model M [--port 8000] [--replicas N] ...")
    serve.set_defaults(func=_serve)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # every option belongs to the serve entry point, --help included
        return _serve(argparse.Namespace(serve_args=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DataError, ConfigError, FileExistsError, FileNotFoundError) as exc:
        print(f"seeder {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
