"""``seeder mcp``: a trained SeedER model as an MCP server with a ``retrieve`` tool (the ``mcp`` extra)."""

from __future__ import annotations

import argparse
import sys

from seeder.cli.arguments import add_accept_mismatch_argument, add_compile_argument, add_encoder_precision_argument
from seeder.serving.retriever import Retriever


def run(args: argparse.Namespace) -> int:
    try:
        # An optional dependency (pip install 'seeder[mcp]'): imported only when the command runs, so that
        # the seeder command, and every other command, load without the mcp package.
        from seeder.integrations import mcp as mcp_server
    except ImportError as exc:
        print(f"seeder mcp: error: {exc}", file=sys.stderr)
        return 2
    retriever = Retriever.load(
        args.model,
        artifacts=args.artifacts,
        device=args.device,
        accept_mismatch=args.accept_mismatch,
        encoder_precision=args.encoder_precision,
        compiled=args.compile,
    )
    retriever.warm_up()  # the indexes (and compiled graphs) before the first call, not during it
    where = "stdio" if args.transport == "stdio" else f"http://{mcp_server.HOST}:{args.port}/mcp"
    # stderr: on stdio, stdout carries the protocol.
    print(f"seeder mcp: {retriever.source} answers the retrieve tool on {where}", file=sys.stderr, flush=True)
    try:
        mcp_server.serve(retriever, args.transport, args.port)
    except KeyboardInterrupt:
        pass
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve a trained model as an MCP server with a retrieve tool (stdio, or HTTP on 127.0.0.1; pip install 'seeder[mcp]')",
    )
    parser.add_argument("--model", required=True, help="model directory (RUN/model), runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts to search (default: the ones the model was trained on)")
    parser.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (default: for a client that starts the server) or http (streamable HTTP on 127.0.0.1, path /mcp)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port of --transport http")
    parser.add_argument("--device", default="cpu", help="torch device of the policy and the encoder (default cpu)")
    add_encoder_precision_argument(parser)
    add_compile_argument(parser)
    add_accept_mismatch_argument(parser)
    parser.set_defaults(func=run)
