"""The repository's own rules, checked by the tools that define them: the library's layers
(import-linter contracts in pyproject.toml), lint and format (ruff), and no edits of sys.path."""

from __future__ import annotations

import os
import subprocess
import sys
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
