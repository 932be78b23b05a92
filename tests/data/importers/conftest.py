"""Shared fixtures of the importer tests: the real-data folder and a small STaRK-layout knowledge base."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest


def shared_data() -> Path:
    """``../shared/data`` next to the repository (or $SEEDER_SHARED_DATA)."""
    env = os.environ.get("SEEDER_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def metaqa_root() -> Path:
    root = shared_data() / "metaqa"
    if not (root / "kb.txt").is_file():
        pytest.skip(f"real MetaQA files not found at {root} (set SEEDER_SHARED_DATA to the shared data folder)")
    return root


@pytest.fixture(scope="session")
def stark_qa_root() -> Path:
    root = shared_data() / "stark-qa"
    if not (root / "prime" / "stark_qa" / "stark_qa.csv").is_file():
        pytest.skip(f"real STaRK query files not found at {root} (set SEEDER_SHARED_DATA to the shared data folder)")
    return root


def make_stark_kb(folder: Path, num_nodes: int, edges=None, node_info=None, edge_type_dict=None) -> Path:
    """Write a STaRK ``processed/`` folder: two node types, two edge types, a ring of edges by default."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    node_types = torch.arange(num_nodes) % 2
    if edges is None:
        src = torch.arange(num_nodes)
        edges = (torch.stack([src, (src + 1) % num_nodes]), src % 2)
    edge_index, edge_types = edges
    if node_info is None:
        node_info = {
            i: (
                {"name": f"GENE{i}", "source": "NCBI", "details": {"summary": f"gene number {i}"}}
                if i % 2 == 0
                else {"title": f"Paper {i}", "year": 2000 + i % 20}
            )
            for i in range(num_nodes)
        }
    torch.save(node_types, folder / "node_types.pt")
    torch.save(edge_index, folder / "edge_index.pt")
    torch.save(edge_types, folder / "edge_types.pt")
    for name, obj in (
        ("node_info.pkl", node_info),
        ("node_type_dict.pkl", {0: "gene/protein", 1: "paper"}),
        ("edge_type_dict.pkl", edge_type_dict or {0: "ppi", 1: "author___writes___paper"}),
    ):
        with open(folder / name, "wb") as fh:
            pickle.dump(obj, fh)
    return folder


def make_stark_qa(folder: Path, rows: list[tuple[int, str, str]], splits: dict[str, list[int]]) -> Path:
    (folder / "stark_qa").mkdir(parents=True, exist_ok=True)
    (folder / "split").mkdir(exist_ok=True)
    lines = ["id,query,answer_ids"] + [f'{i},"{q}","{a}"' for i, q, a in rows]
    (folder / "stark_qa" / "stark_qa.csv").write_text("\n".join(lines) + "\n")
    for name in ("train", "val", "test"):
        (folder / "split" / f"{name}.index").write_text("\n".join(str(i) for i in splits.get(name, [])))
    return folder
