"""Generic triples importer: TSV, CSV and Parquet, column names, node texts, queries and hash splits."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from seeder.cli.main import main
from seeder.data.importers import hash_split, stable_hash
from seeder.data.importers.triples import import_triples
from seeder.data.store import open_dataset


def edge_set(kg):
    names = kg.nodes.column("name").to_pylist()
    rels = kg.relations.column("name").to_pylist()
    e = kg.table("edges").to_pydict()
    return {(names[s], rels[r], names[d]) for s, d, r in zip(e["src"], e["dst"], e["relation"])}


TRIPLES = {("alice", "knows", "bob"), ("bob", "works_at", "acme"), ("carol", "knows", "alice")}


def test_tsv_with_nodes_and_queries(tmp_path):
    (tmp_path / "t.tsv").write_text("head\trelation\ttail\n" + "".join(f"{h}\t{r}\t{t}\n" for h, r, t in TRIPLES))
    (tmp_path / "n.csv").write_text(
        "id,text,type,name\nalice,Alice is a chemist,person,Alice A.\nacme,Acme Corp,company,\n"
        "dave,Dave is isolated,person,Dave\n"
    )
    (tmp_path / "q.csv").write_text(
        "text,answers,split,level\nwho does alice know,bob,train,1\nwho knows someone,alice|carol|alice,test,2\n"
    )
    import_triples(tmp_path / "t.tsv", tmp_path / "ds", nodes_path=tmp_path / "n.csv", queries_path=tmp_path / "q.csv")
    kg = open_dataset(tmp_path / "ds")
    nodes = {r["name"]: r for r in kg.nodes.to_pylist()}
    assert nodes["Alice A."]["text"] == "Alice is a chemist" and nodes["Alice A."]["type"] == "person"
    assert nodes["acme"]["type"] == "company"  # empty name column falls back to the id
    assert nodes["bob"]["text"] == "bob" and nodes["bob"]["type"] == "entity"
    assert "Dave" in nodes  # node-file nodes without triples are kept
    assert kg.num_edges == 3
    rel_text = dict(zip(kg.relations.column("name").to_pylist(), kg.relations.column("text").to_pylist()))
    assert rel_text == {"knows": "knows", "works_at": "works at"}
    q = kg.queries.to_pylist()
    ids = kg.nodes.column("id").to_pylist()
    keyed = dict(zip([r["name"] for r in kg.nodes.to_pylist()], ids))
    assert q[0]["answers"] == [keyed["bob"]] and q[0]["split"] == "train"
    assert sorted(q[1]["answers"]) == sorted([keyed["Alice A."], keyed["carol"]])
    assert q[1]["level"] == 2 and kg.manifest["query_attributes"] == ["level"]


def test_csv_custom_columns_and_parquet_and_headerless(tmp_path):
    (tmp_path / "t.csv").write_text("s,p,o\n" + "".join(f"{h},{r},{t}\n" for h, r, t in TRIPLES))
    import_triples(tmp_path / "t.csv", tmp_path / "a", head_col="s", relation_col="p", tail_col="o")
    assert edge_set(open_dataset(tmp_path / "a")) == TRIPLES
    rows = sorted(TRIPLES)
    pq.write_table(
        pa.table({"h": [r[0] for r in rows], "rel": [r[1] for r in rows], "t": [r[2] for r in rows]}), tmp_path / "t.parquet"
    )
    import_triples(tmp_path / "t.parquet", tmp_path / "b")  # three columns: taken in order
    assert edge_set(open_dataset(tmp_path / "b")) == TRIPLES
    (tmp_path / "h.tsv").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in TRIPLES))
    assert main(["import", "triples", "--triples", str(tmp_path / "h.tsv"), "--no-header", "--out", str(tmp_path / "c")]) == 0
    assert edge_set(open_dataset(tmp_path / "c")) == TRIPLES


def test_hash_split_is_stable_and_close_to_the_fractions():
    texts = pa.array([f"question number {i}" for i in range(20_000)])
    a = hash_split(texts, 0.1, 0.2).to_pylist()
    assert a == hash_split(texts, 0.1, 0.2).to_pylist()
    share = {s: a.count(s) / len(a) for s in ("train", "val", "test")}
    assert abs(share["val"] - 0.1) < 0.01 and abs(share["test"] - 0.2) < 0.01
    # FNV-1a 64 reference values (computed by the published algorithm, independent of this code).
    assert stable_hash(pa.array(["", "a", "foobar"])).tolist() == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8]


def test_queries_split_by_hash_when_no_split_column(tmp_path):
    (tmp_path / "t.tsv").write_text("head\trelation\ttail\n" + "".join(f"n{i}\tr\tn{i + 1}\n" for i in range(50)))
    (tmp_path / "q.tsv").write_text("text\tanswers\n" + "".join(f"where is n{i}\tn{i}\n" for i in range(50)))
    import_triples(tmp_path / "t.tsv", tmp_path / "ds", queries_path=tmp_path / "q.tsv", val_fraction=0.3, test_fraction=0.0)
    splits = open_dataset(tmp_path / "ds").queries.column("split").to_pylist()
    assert set(splits) == {"train", "val"}
    expected = hash_split(pa.array([f"where is n{i}" for i in range(50)]), 0.3, 0.0).to_pylist()
    assert splits == expected


def nodes_by_name(kg):
    return {row["name"]: row for row in kg.nodes.to_pylist()}


def test_ids_are_strings_exactly_as_written(tmp_path):
    """Leading zeros, dates, floats and booleans are ids, not numbers: nothing merges, nothing is refused."""
    (tmp_path / "t.tsv").write_text(
        "head\trelation\ttail\n007\tr\t7\n01\tr\t1\n2020-01-01\ttrue\t1.50\n1e3\t01\tNaN\nnull\t1\t007\n"
    )
    (tmp_path / "n.csv").write_text("id,text,name\n007,agent zero zero seven,Bond\n7,the number seven,\n")
    (tmp_path / "q.tsv").write_text("text\tanswers\tlevel\nwho is 007\t007\t2\nwhich ones\t01|1|1.50\t3\n")
    import_triples(tmp_path / "t.tsv", tmp_path / "ds", nodes_path=tmp_path / "n.csv", queries_path=tmp_path / "q.tsv")
    kg = open_dataset(tmp_path / "ds")
    nodes = nodes_by_name(kg)
    assert set(nodes) == {"Bond", "7", "01", "1", "2020-01-01", "1.50", "1e3", "NaN", "null"}
    assert nodes["Bond"]["text"] == "agent zero zero seven" and nodes["7"]["text"] == "the number seven"
    assert kg.relations.column("name").to_pylist() == ["01", "1", "r", "true"]
    names = kg.nodes.column("name").to_pylist()
    assert edge_set(kg) == {
        ("Bond", "r", "7"),
        ("01", "r", "1"),
        ("2020-01-01", "true", "1.50"),
        ("1e3", "01", "NaN"),
        ("null", "1", "Bond"),
    }
    queries = kg.queries.to_pylist()
    assert [names[a] for a in queries[0]["answers"]] == ["Bond"]  # the answer 007 is the node 007
    assert sorted(names[a] for a in queries[1]["answers"]) == ["01", "1", "1.50"]
    assert queries[0]["level"] == 2  # attribute columns keep their types


def test_duplicate_triples_are_dropped_and_counted(tmp_path, capsys):
    rows = "a\tr\tb\nb\tr\tc\na\tr\tb\na\ts\tb\nb\tr\tc\na\tr\tb\n"
    (tmp_path / "t.tsv").write_text("head\trelation\ttail\n" + rows)
    assert main(["import", "triples", "--triples", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "ds")]) == 0
    assert "3 edges, 2 relations; 3 duplicate triples dropped" in capsys.readouterr().err
    kg = open_dataset(tmp_path / "ds")
    assert kg.manifest["source"]["duplicate_triples"] == 3
    e = kg.table("edges").to_pydict()
    names, rels = kg.nodes.column("name").to_pylist(), kg.relations.column("name").to_pylist()
    # First occurrences, in file order.
    assert [(names[s], rels[r], names[d]) for s, d, r in zip(e["src"], e["dst"], e["relation"])] == [
        ("a", "r", "b"),
        ("b", "r", "c"),
        ("a", "s", "b"),
    ]


def test_a_bom_never_becomes_part_of_an_id(tmp_path):
    bom = "\ufeff"
    (tmp_path / "t.tsv").write_text(bom + "head\trelation\ttail\nKismet\tdirected_by\tDieterle\n", encoding="utf-8")
    (tmp_path / "h.tsv").write_text(bom + "Kismet\tdirected_by\tDieterle\n", encoding="utf-8")
    (tmp_path / "n.csv").write_text(bom + "id,text\nKismet,a 1944 film\n", encoding="utf-8")
    (tmp_path / "q.tsv").write_text(bom + "text\tanswers\nwho directed Kismet\tDieterle\n", encoding="utf-8")
    import_triples(tmp_path / "t.tsv", tmp_path / "a", nodes_path=tmp_path / "n.csv", queries_path=tmp_path / "q.tsv")
    import_triples(tmp_path / "h.tsv", tmp_path / "b", no_header=True)
    for ds in ("a", "b"):
        kg = open_dataset(tmp_path / ds)
        assert sorted(kg.nodes.column("name").to_pylist()) == ["Dieterle", "Kismet"]
        assert edge_set(kg) == {("Kismet", "directed_by", "Dieterle")}
    kg = open_dataset(tmp_path / "a")
    assert nodes_by_name(kg)["Kismet"]["text"] == "a 1944 film"
    assert kg.queries.column("text").to_pylist() == ["who directed Kismet"]


def test_a_relation_named_only_of_underscores_reads_as_its_name(tmp_path):
    # Found by the fuzz test: "_" became the empty text "", which the store then refused.
    (tmp_path / "t.tsv").write_text("a\t_\tb\na\tis_a\tb\n")
    import_triples(tmp_path / "t.tsv", tmp_path / "ds", no_header=True)
    kg = open_dataset(tmp_path / "ds")
    assert dict(zip(kg.relations.column("name").to_pylist(), kg.relations.column("text").to_pylist())) == {
        "_": "_",
        "is_a": "is a",
    }
