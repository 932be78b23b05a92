"""The adapters are optional extras: the library and the ``seeder`` command load without their frameworks,
and an adapter (or ``seeder mcp``) without its framework fails with one line naming the extra. The
frameworks are hidden from a child process (``sys.modules[name] = None``), so these run whether or not
the extras are installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ENV

FRAMEWORKS = ("langchain_core", "llama_index", "mcp")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)


def test_the_seeder_command_imports_no_framework():
    done = _python(
        "import sys, seeder.cli.main\n"
        "from seeder.cli.main import build_parser\n"
        "build_parser()\n"
        f"print(sorted({set(FRAMEWORKS)!r} & {{m.split('.')[0] for m in sys.modules}}))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("module, extra", [("langchain", "langchain"), ("llamaindex", "llamaindex"), ("mcp", "mcp")])
def test_an_adapter_without_its_framework_names_the_extra(module, extra):
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in FRAMEWORKS)
    done = _python(f"import sys\n{hide}import seeder.integrations.{module}")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: seeder.integrations.{module} needs ") and last.endswith(
        f"pip install 'seeder[{extra}]'"
    )


def test_seeder_mcp_without_mcp_names_the_extra():
    done = _python(
        "import sys\nsys.modules['mcp'] = None\nfrom seeder.cli.main import main\nsys.exit(main(['mcp', '--model', 'any']))"
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("seeder mcp: error: seeder.integrations.mcp needs mcp>=2 (")
    assert lines[0].endswith("): pip install 'seeder[mcp]'")
