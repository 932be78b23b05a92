"""The Python blocks of docs/integrations.md, run by the tests with the hand-built model in place of the
page's, so that the page's examples are the code the tests check."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
PAGE_MODEL = '"runs/metaqa/model/model"'
"""How the page names its model, in every block."""


def python_blocks(section: str) -> list[str]:
    """The ```python blocks under the page's ``## section`` heading, in order."""
    text = PAGE.read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    body = next((p for p in parts[1:] if p.splitlines()[0].strip() == section), None)
    assert body is not None, f"docs/integrations.md has no section '## {section}'"
    blocks = re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)
    assert blocks, f"docs/integrations.md: no python block under '## {section}'"
    return blocks


def run_blocks(section: str, model, replace: dict[str, str] | None = None, given: dict | None = None) -> dict:
    """Run the section's blocks in one namespace that starts with ``given``, with ``model`` for the page's
    model (and each of ``replace``'s strings, which must appear on the page, by its value); return the
    namespace."""
    namespace: dict = {"__name__": "docs_integrations", **(given or {})}
    code = "\n".join(python_blocks(section))
    assert PAGE_MODEL in code, f"the {section} blocks no longer load {PAGE_MODEL}"
    code = code.replace(PAGE_MODEL, repr(str(model)))
    for old, new in (replace or {}).items():
        assert old in code, f"the {section} blocks no longer contain {old!r}"
        code = code.replace(old, new)
    exec(compile(code, f"docs/integrations.md ({section})", "exec"), namespace)
    return namespace
