"""The repository's own rules: the library's layers (import-linter contracts in pyproject.toml), lint and
format (ruff), no edits of sys.path, and code that states decisions, not a diary (no dates, at most one
measured figure per docstring or comment block; the measurements live in benchmarks/RESULTS.md)."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO, capture_output=True, text=True, env=env)


def test_the_layers_hold_and_the_library_never_imports_ray_or_its_entry_points():
    done = _run("lint-imports", "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_ruff_finds_nothing_to_fix():
    done = _run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_code_is_formatted():
    done = _run("ruff", "format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout[-4000:]}"


def test_nothing_edits_sys_path():
    files = [p for d in ("seeder", "pipelines", "tune") for p in sorted((REPO / d).rglob("*.py"))]
    assert files and [str(p.relative_to(REPO)) for p in files if "sys.path" in p.read_text()] == []


DATE = re.compile(
    r"\b(January|February|March|April|May|June|July|August|September|October|November|December)\s+\d{1,2}\b"
    r"|\b20\d\d-\d\d-\d\d\b"
)
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|us|s|min|GB|GiB|MB|MiB|x|%)(?![\w])")


def _texts(path: Path):
    """(line, text) of every docstring and of every block of consecutive comment lines in ``path``."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
    block, start, last = [], 0, -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if block and token.start[0] == last + 1:
                block.append(token.string)
            else:
                if block:
                    yield start, "\n".join(block)
                block, start = [token.string], token.start[0]
            last = token.start[0]
    if block:
        yield start, "\n".join(block)


def test_docstrings_and_comments_state_decisions_not_run_logs():
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in ("seeder", "pipelines", "tune")
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, text in _texts(path)
        if DATE.search(text) or len(FIGURE.findall(text)) > 1
    ]
    assert offenders == [], "move the run log to benchmarks/RESULTS.md, keep the decision and one figure"


def test_the_diary_check_sees_a_date_and_two_figures(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Fast."""\n# On November 27 it took 3 ms\n# against 9 ms.\nx = 1\n')
    found = [text for _, text in _texts(sample) if DATE.search(text) or len(FIGURE.findall(text)) > 1]
    assert found == ["# On November 27 it took 3 ms\n# against 9 ms."]
