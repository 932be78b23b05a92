"""The ``seeder`` command line: one module per subcommand (``main`` builds the parser); argument parsers
live here, not in the library."""
