"""STaRK importer: a knowledge base in STaRK's layout built here, and the REAL query files and splits."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from seeder.data.importers.stark import import_stark, node_document, read_queries, relation_text
from seeder.data.store import open_dataset
from tests.data.importers.conftest import make_stark_kb, make_stark_qa


def split_ids(root, name):
    return {int(x) for x in (root / "split" / f"{name}.index").read_text().split()}


@pytest.mark.parametrize("name", ["prime", "mag", "amazon"])
def test_real_queries_parse_and_splits_match_the_index_files(stark_qa_root, name):
    root = stark_qa_root / name
    queries = read_queries(root)
    for split in ("train", "val", "test"):
        expected = split_ids(root, split)
        got = set(queries.filter(pc.equal(queries.column("split"), split)).column("id").to_pylist())
        assert got == expected
    assert queries.num_rows == sum(len(split_ids(root, s)) for s in ("train", "val", "test"))
    lengths = pc.list_value_length(queries.column("answers")).to_numpy()
    assert (lengths >= 1).all()
    assert pc.min(pc.utf8_length(queries.column("text"))).as_py() > 0


def test_real_prime_queries_import_into_a_kb_covering_their_answers(stark_qa_root, tmp_path):
    root = stark_qa_root / "prime"
    max_answer = int(pc.max(pc.list_flatten(read_queries(root).column("answers"))).as_py())
    n = max_answer + 1
    kb = make_stark_kb(tmp_path / "kb", n, node_info={i: {"name": f"n{i}"} for i in range(0, n, 2)})
    import_stark(kb, root, tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    assert kg.num_nodes == n and kg.num_edges == n
    assert kg.queries_of("val").num_rows == len(split_ids(root, "val"))
    first = kg.queries.slice(0, 1).to_pylist()[0]
    assert first["id"] == 10328 and first["answers"] == [18423]  # the CSV's first row
    # Nodes without node_info still get a name and a text.
    assert kg.nodes.slice(1, 1).to_pylist()[0]["name"] == "paper 1"


def test_small_kb_nodes_relations_edges(tmp_path):
    kb = make_stark_kb(tmp_path / "kb", 6)
    qa = make_stark_qa(
        tmp_path / "qa", [(5, "find gene zero", "[0, 2, 0]"), (7, "paper one?", "[1]")], {"train": [5], "test": [7]}
    )
    import_stark(kb, qa, tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    nodes = kg.nodes.to_pylist()
    assert nodes[0]["type"] == "gene/protein" and nodes[0]["name"] == "GENE0"
    assert nodes[0]["text"] == "- type: gene/protein\n- name: GENE0\n- source: NCBI\n- details: summary: gene number 0"
    assert nodes[1]["name"] == "Paper 1" and "- year: 2001" in nodes[1]["text"]
    assert kg.relations.column("text").to_pylist() == ["ppi", "writes"]
    assert kg.queries.column("answers").to_pylist() == [[0, 2], [1]]  # duplicate answer id removed
    assert kg.queries.column("split").to_pylist() == ["train", "test"]
    edges = kg.table("edges").to_pydict()
    assert edges["src"] == [0, 1, 2, 3, 4, 5] and edges["dst"] == [1, 2, 3, 4, 5, 0]
    assert edges["relation"] == [0, 1, 0, 1, 0, 1]


def test_node_text_is_bounded_and_generic():
    name, text = node_document("product", {"title": "Ball", "description": "x" * 5000, "tags": list(range(100))}, 3)
    assert name == "Ball"
    assert len(text) <= 2000 and text.startswith("- type: product\n- name: Ball\n- description: xxx")
    assert node_document("drug", None, 9) == ("drug 9", "- type: drug\n- name: drug 9")
    assert relation_text("paper___has_topic___field_of_study") == "has topic"
    assert relation_text("off-label use") == "off-label use"


def test_edge_type_ids_need_not_be_contiguous(tmp_path):
    import torch

    edges = (torch.tensor([[0, 1], [1, 2]]), torch.tensor([10, 30]))
    kb = make_stark_kb(tmp_path / "kb", 3, edges=edges, edge_type_dict={10: "a_b", 30: "c"})
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[2]")], {"train": [1]})
    import_stark(kb, qa, tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    assert np.array_equal(kg.table("edges").column("relation").to_numpy(), [0, 1])
    assert kg.relations.column("text").to_pylist() == ["a b", "c"]
