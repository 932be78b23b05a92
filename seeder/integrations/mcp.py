"""A trained SeedER model as an MCP server with one tool, ``retrieve`` (``pip install 'seeder[mcp]'``).

``seeder mcp --model M`` runs it on stdio, the transport an MCP client (an IDE, a desktop assistant, an
agent framework) starts a server on; ``--transport http`` serves streamable HTTP on 127.0.0.1 instead.
The tool takes a question, ``k`` and optional node ``types``, and returns the ranked nodes (rank, id,
name, type, score), the triples among them and the dataset version that answered, as structured
content and as its JSON text. It runs on the ``mcp`` package's ``MCPServer`` (mcp 2's name for
FastMCP), which calls a plain function tool on a worker thread; calls take the retriever's lock
(``seeder.integrations.lock_of``), one at a time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from seeder.integrations import ask, missing_extra
from seeder.serving.retriever import Retriever
from seeder.system.io import DataError

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import BaseModel, Field
except ImportError as exc:  # an optional dependency: the extra names it
    raise missing_extra(__name__, "mcp", "mcp>=2", exc) from exc

TRANSPORTS = ("stdio", "http")
"""``stdio`` (the default of MCP clients that start the server themselves) or streamable ``http``."""

HOST = "127.0.0.1"
"""Where ``--transport http`` listens: the tool has no authentication, so loopback only."""


class Node(BaseModel):
    """One retrieved node."""

    rank: int = Field(description="1 is the most relevant")
    id: int = Field(description="the node's id in the graph")
    name: str
    type: str
    score: float = Field(description="the model's score; higher is more relevant")


class Retrieved(BaseModel):
    """The answer of the ``retrieve`` tool."""

    question: str
    dataset: str = Field(description="the version (fingerprint) of the graph that answered")
    nodes: list[Node] = Field(description="the retrieved nodes, best first")
    triples: list[tuple[str, str, str]] = Field(description="(head, relation, tail) facts among the retrieved nodes")
    provenance: list[dict[str, Any]] = Field(
        description="where each triple came from, in the same order: the graph version, the edge's row and, where "
        "the import kept them, the input file, its line or row, and the RDF IRIs"
    )


def build_server(retriever: Retriever, log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING") -> MCPServer:
    """An ``MCPServer`` whose ``retrieve`` tool answers through ``retriever``; the tool's description
    names the graph, for the model that chooses tools."""
    graph = retriever.artifacts.dataset.path.name
    server = MCPServer(
        "seeder",
        instructions=f"Retrieves the nodes of the knowledge graph {graph!r} relevant to a question, and the facts among them.",
        log_level=log_level,
    )

    @server.tool(
        description=f"Find the nodes of the knowledge graph {graph!r} most relevant to a question, best first, "
        "with the (head, relation, tail) facts among them. Use it to look up entities and their relations "
        "before answering a question about them."
    )
    def retrieve(
        question: Annotated[str, Field(description="the question, in natural language")],
        k: Annotated[int, Field(ge=1, description="how many nodes to return")] = 10,
        types: Annotated[list[str] | None, Field(description="return only nodes of these types")] = None,
    ) -> Retrieved:
        try:
            hits = ask(retriever, question, k, types)
        except DataError as exc:  # a question or filter the graph cannot answer: the message is for the caller
            raise ToolError(str(exc)) from exc
        return Retrieved(
            question=hits.question,
            dataset=hits.dataset,
            nodes=[Node(rank=n.rank, id=n.id, name=n.name, type=n.type, score=n.score) for n in hits.nodes],
            triples=hits.triples,
            provenance=hits.provenance,
        )

    return server


def serve(retriever: Retriever, transport: str = "stdio", port: int = 8000) -> None:
    """Answer on stdio until the client closes it, or on ``http://127.0.0.1:PORT/mcp`` until interrupted."""
    if transport not in TRANSPORTS:
        raise DataError(f"transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    if transport == "stdio":
        build_server(retriever).run("stdio")
    else:
        build_server(retriever, log_level="INFO").run("streamable-http", host=HOST, port=port)
