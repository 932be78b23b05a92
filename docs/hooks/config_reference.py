"""mkdocs hook: the configuration reference, generated from ``seeder/config.py`` at build time.

``docs/configuration.md`` holds the marker below; this hook replaces it with one table per config
section (key, default, meaning), read from the dataclasses and their field docstrings
(``seeder.config.field_docs``), so the reference cannot drift from the code. Registered in
``mkdocs.yml`` under ``hooks:``; ``exclude_docs: hooks/`` keeps this file out of the site.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

MARKER = "<!-- config-reference -->"


def on_config(config):
    """Import ``seeder.config`` from this checkout, whatever the current directory."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    from seeder import config as seeder_config

    return markdown.replace(MARKER, reference(seeder_config))


def reference(seeder_config) -> str:
    """Markdown: a heading, the section's docstring and a table of its keys, for every section."""
    lines: list[str] = []

    def section(instance, name: str, doc: str) -> None:
        docs = seeder_config.field_docs(type(instance))
        rows, nested = [], []
        for f in dataclasses.fields(instance):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(value):
                nested.append((value, f"{name}.{f.name}", docs.get(f.name, "")))
            else:
                rows.append(f"| `{name}.{f.name}` | `{value!r}` | {_cell(docs.get(f.name, ''))} |")
        lines.extend([f"### `{name}`", "", doc, ""])
        if rows:
            lines.extend(["| key | default | meaning |", "|---|---|---|", *rows, ""])
        for args in nested:
            section(*args)

    top = seeder_config.SeederConfig()
    top_docs = seeder_config.field_docs(seeder_config.SeederConfig)
    for f in dataclasses.fields(top):
        section(getattr(top, f.name), f.name, top_docs.get(f.name, ""))
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A docstring as one table cell: a ``|`` would end the cell."""
    return text.replace("|", "\\|")
