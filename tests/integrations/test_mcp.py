"""``seeder mcp`` (seeder.integrations.mcp): a real MCP client session with the server started as a
client starts it (``python -m seeder.cli mcp --model M`` on stdio), and over streamable HTTP on
127.0.0.1: the ``retrieve`` tool answers with the nodes of ``Retriever.retrieve``; the page's client
example runs (docs/integrations.md, "MCP")."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra (mcp>=2) is not installed: pip install -e '.[mcp]'")

import anyio  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from tests.conftest import ENV, free_port  # noqa: E402
from tests.integrations.docs import run_blocks  # noqa: E402
from tests.processes import stop_gracefully  # noqa: E402
from tests.sockets import is_loopback, listeners, ss_available  # noqa: E402

SESSION_SECONDS = 180
"""A session's limit: the server imports torch and loads the model before it answers."""


def _server_command(model, *options: str) -> list[str]:
    return [sys.executable, "-m", "seeder.cli", "mcp", "--model", str(model), *options]


async def _session_checks(session: ClientSession, retriever, questions) -> None:
    """list_tools shows retrieve; call_tool answers as the Python API; a filter nothing matches is a tool error."""
    await session.initialize()
    tools = (await session.list_tools()).tools
    assert [tool.name for tool in tools] == ["retrieve"]
    assert set(tools[0].input_schema["properties"]) == {"question", "k", "types"}
    assert tools[0].input_schema["required"] == ["question"]
    for question, k, types in ((questions[0], 5, None), (questions[1], 10, None), (questions[2], 4, ["place"])):
        arguments = {"question": question, "k": k, **({"types": types} if types else {})}
        result = await session.call_tool("retrieve", arguments)
        assert not result.is_error, result.content
        answer = result.structured_content
        hits = retriever.retrieve(question, k=k, types=types)[0]
        assert [n["id"] for n in answer["nodes"]] == [n.id for n in hits.nodes]
        assert [n["score"] for n in answer["nodes"]] == pytest.approx([n.score for n in hits.nodes], rel=1e-5)
        assert [(n["rank"], n["name"], n["type"]) for n in answer["nodes"]] == [(n.rank, n.name, n.type) for n in hits.nodes]
        assert [tuple(t) for t in answer["triples"]] == hits.triples
        assert answer["provenance"] == hits.provenance
        assert answer["dataset"] == hits.dataset == retriever.dataset_version
        assert answer["question"] == question
        assert all(n.name in result.content[0].text for n in hits.nodes)  # the same answer as JSON text
    refused = await session.call_tool("retrieve", {"question": questions[0], "types": ["no such type"]})
    assert refused.is_error and "no node matches" in refused.content[0].text


def test_a_client_session_over_stdio(retriever, hand_built, questions):
    server = StdioServerParameters(command=sys.executable, args=_server_command(hand_built[1])[1:], env=dict(ENV))

    async def session():
        with anyio.fail_after(SESSION_SECONDS):
            async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
                await _session_checks(client, retriever, questions)

    anyio.run(session)


def test_a_client_session_over_http_on_loopback(retriever, hand_built, questions, tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            _server_command(hand_built[1], "--transport", "http", "--port", str(port)), stdout=stderr, stderr=stderr, env=ENV
        )
    try:
        deadline = time.monotonic() + SESSION_SECONDS
        url = f"http://127.0.0.1:{port}/mcp"
        while "Application startup complete" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert f"answers the retrieve tool on {url}" in log.read_text()
        if ss_available():
            mine = [listener for listener in listeners() if listener.pid == proc.pid]
            assert mine and all(is_loopback(listener.address) for listener in mine), mine

        async def session():
            with anyio.fail_after(SESSION_SECONDS):
                async with streamable_http_client(url) as (read, write), ClientSession(read, write) as client:
                    await _session_checks(client, retriever, questions)

        anyio.run(session)
    finally:
        stop_gracefully(proc, timeout=30)


def test_the_pages_client_example_runs(retriever, hand_built, capsys):
    """The page starts ``seeder``; the test starts the same command as ``python -m seeder.cli`` with this
    environment, so that it runs this checkout."""
    page_server = 'StdioServerParameters(command="seeder", args=["mcp", "--model", '
    here = f'StdioServerParameters(env=ENV, command={sys.executable!r}, args=["-m", "seeder.cli", "mcp", "--model", '
    namespace = run_blocks("MCP", hand_built[1], {page_server: here}, given={"ENV": dict(ENV)})
    hits = retriever.retrieve(namespace["question"], k=5)[0]
    assert [n["id"] for n in namespace["answer"]["nodes"]] == [n.id for n in hits.nodes]
    assert str([(n.rank, n.name) for n in hits.nodes]) in capsys.readouterr().out


def test_a_missing_model_is_a_one_line_error():
    done = subprocess.run(_server_command("/nonexistent/model"), capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("seeder mcp: error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""
