"""``seeder serve``: Ray Serve over HTTP, run as the Ray entry point ``pipelines/serve.py`` (never imported)."""

from __future__ import annotations

import argparse
import os
import sys

SERVE_MODULE = "pipelines.serve"  # Ray Serve lives with the other Ray entry points; run, never imported


def run(args: argparse.Namespace) -> int:
    # Replace this process, so that Ctrl-C or a SIGINT reaches the server itself, which then shuts its
    # Ray down (a child killed by its parent would leave the embedded Ray running).
    os.execv(sys.executable, [sys.executable, "-m", SERVE_MODULE, *args.serve_args])
    return 0  # not reached


def register(sub) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve a trained model over HTTP on Ray Serve (127.0.0.1 by default); `seeder serve --help` lists its options",
        add_help=False,
    )
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="--model M [--port 8000] [--replicas N] ...")
    parser.set_defaults(func=run)
