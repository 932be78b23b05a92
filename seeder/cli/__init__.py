"""The ``seeder`` command line: one module per subcommand; argument parsers live here, not in the library."""

from seeder.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
