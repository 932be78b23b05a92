"""Provenance: every edge of an import or an update knows its input file, its row there and the dataset
version that read it, and ``EdgeIndex`` finds it from (head, relation, tail) ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seeder.data.importers.rdf import import_rdf
from seeder.data.importers.triples import import_triples
from seeder.data.provenance import EdgeIndex
from seeder.data.store import open_dataset
from seeder.data.update import update_dataset
from tests.data.importers.test_rdf import METAQA_KB, entity

RELATION_IRI = "http://example.org/relation/"


def ids(kg, triples):
    """(heads, relations, tails) id arrays of name triples."""
    node = {n: i for i, n in enumerate(kg.nodes.column("name").to_pylist())}
    rel = {n: i for i, n in enumerate(kg.relations.column("name").to_pylist())}
    return tuple(np.array(c) for c in zip(*[(node[h], rel[r], node[t]) for h, r, t in triples]))


def write_tsv(path, rows, header=True):
    path.write_text(("head\trelation\ttail\n" if header else "") + "".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))
    return path


def test_a_triples_import_points_each_triple_at_its_line(tmp_path):
    rows = METAQA_KB + [METAQA_KB[2]]  # the repeat is the same fact: its first line is its source
    path = write_tsv(tmp_path / "kb.tsv", rows)
    import_triples(path, tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    index = EdgeIndex(kg)
    distinct = list(dict.fromkeys(rows))
    sources = index.sources(*ids(kg, distinct))
    lines = path.read_text().splitlines()
    for triple, source in zip(distinct, sources):
        assert source["dataset"] == kg.fingerprint and source["file"] == "kb.tsv"
        assert tuple(lines[source["line"] - 1].split("\t")) == triple
    assert sources[2]["line"] == 4  # the first of its two lines
    assert len({s["edge"] for s in sources}) == len(distinct)

    # Not an edge: no row, only the version.
    heads, relations, tails = ids(kg, distinct[:1])
    assert index.rows(tails, relations, heads).tolist() == [-1]
    assert index.sources(tails, relations, heads) == [{"dataset": kg.fingerprint}]


def test_a_parquet_import_counts_rows_from_zero(tmp_path):
    table = pa.table({k: [t[i] for t in METAQA_KB] for i, k in enumerate(("head", "relation", "tail"))})
    pq.write_table(table, tmp_path / "kb.parquet")
    import_triples(tmp_path / "kb.parquet", tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    sources = EdgeIndex(kg).sources(*ids(kg, METAQA_KB[:5]))
    assert [s["row"] for s in sources] == [0, 1, 2, 3, 4] and {s["file"] for s in sources} == {"kb.parquet"}


def test_rdf_triples_know_their_number_and_iris(tmp_path):
    path = tmp_path / "kb.nt"
    path.write_text("".join(f"<{entity(h)}> <{RELATION_IRI}{r}> <{entity(t)}> .\n" for h, r, t in METAQA_KB))
    import_rdf([path], tmp_path / "whole")
    import_rdf([path], tmp_path / "chunked", chunk_rows=3)
    lines = path.read_text().splitlines()
    distinct = list(dict.fromkeys(METAQA_KB))
    for name in ("whole", "chunked"):
        kg = open_dataset(tmp_path / name)
        for (h, r, t), source in zip(distinct, EdgeIndex(kg).sources(*ids(kg, distinct))):
            assert source["file"] == "kb.nt"
            assert source["iri"] == [entity(h), RELATION_IRI + r, entity(t)]
            # one statement a line: the triple's number is its line
            assert lines[source["triple"] - 1] == f"<{entity(h)}> <{RELATION_IRI}{r}> <{entity(t)}> ."


def test_an_update_keeps_the_parents_sources_and_adds_its_own(tmp_path):
    write_tsv(tmp_path / "kb.tsv", METAQA_KB)
    import_triples(tmp_path / "kb.tsv", tmp_path / "v1")
    parent = open_dataset(tmp_path / "v1")
    added = ("Kismet", "has_genre", "Musical")
    removed = METAQA_KB[0]
    change = tmp_path / "change.tsv"
    change.write_text("head\trelation\ttail\top\n" + "\t".join(removed) + "\tremove\n" + "\t".join(added) + "\tadd\n")
    update_dataset(tmp_path / "v1", tmp_path / "v2", triples_path=change)
    kg = open_dataset(tmp_path / "v2")
    index = EdgeIndex(kg)
    kept, new = index.sources(*ids(kg, [METAQA_KB[1], added]))
    assert kept["dataset"] == parent.fingerprint and kept["file"] == "kb.tsv" and kept["line"] == 3
    assert new["dataset"] == kg.fingerprint and new["file"] == "change.tsv" and new["line"] == 3
    assert index.rows(*ids(kg, [removed])).tolist() == [-1]

    # An update of an update: the first version's triples still name it.
    again = tmp_path / "again.tsv"
    again.write_text("head\trelation\ttail\top\n" + "\t".join(METAQA_KB[3]) + "\tremove\n")
    update_dataset(tmp_path / "v2", tmp_path / "v3", triples_path=again)
    v3 = open_dataset(tmp_path / "v3")
    kept, new = EdgeIndex(v3).sources(*ids(v3, [METAQA_KB[1], added]))
    assert kept["dataset"] == parent.fingerprint and new["dataset"] == kg.fingerprint and new["file"] == "change.tsv"
