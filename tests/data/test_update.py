"""Updates: a change set applied to a triples import equals a fresh import of the final graph, keeps ids,
records its parent, and refuses bad change sets with one line naming the file and the line."""

from __future__ import annotations

import re

import pytest

from seeder.cli.main import main
from seeder.data.importers.triples import import_triples
from seeder.data.store import REMOVED_TYPE, open_dataset
from seeder.data.update import update_dataset
from seeder.system.io import DataError

PARENT_TRIPLES = [
    ("alice", "knows", "bob"),
    ("bob", "works_at", "acme"),
    ("carol", "knows", "alice"),
    ("dave", "knows", "carol"),
    ("erin", "likes", "acme"),
]
PARENT_NODES = (
    "id,text,type\nalice,Alice is a chemist,person\nacme,Acme Corp,company\nbob,Bob,person\nfrank,Frank is isolated,person\n"
)
PARENT_QUERIES = (
    "text,answers,split\nwho does alice know,bob,train\nwho works at acme,bob,val\nwho does dave know,carol,test\n"
    "who likes acme,erin,train\nwho knows someone,alice|carol|dave,train\n"
)

CHANGE_TRIPLES = "head\trelation\ttail\top\nbob\tworks_at\tacme\tremove\nbob\tworks_at\tglobex\tadd\ngina\tknows\talice\tadd\nalice\tmentors\tbob\tadd\n"
CHANGE_NODES = "id,text,type,op\nglobex,Globex Inc,company,add\nalice,Alice is a physicist,,add\nacme,Acme Corporation,org,add\ncarol,,,remove\n"
CHANGE_QUERIES = (
    "text,answers,split,op\nwho likes acme,,,remove\nwho works at globex,bob,test,add\nwho does gina know,alice,train,add\n"
)

# The graph the change set describes, written for a fresh import.
FINAL_TRIPLES = [
    ("alice", "knows", "bob"),
    ("erin", "likes", "acme"),
    ("bob", "works_at", "globex"),
    ("gina", "knows", "alice"),
    ("alice", "mentors", "bob"),
]
FINAL_NODES = (
    "id,text,type\nalice,Alice is a physicist,person\nacme,Acme Corporation,org\nbob,Bob,person\n"
    "frank,Frank is isolated,person\nglobex,Globex Inc,company\ndave,dave,entity\n"
)
FINAL_QUERIES = (
    "text,answers,split\nwho does alice know,bob,train\nwho works at acme,bob,val\nwho knows someone,alice|dave,train\n"
    "who works at globex,bob,test\nwho does gina know,alice,train\n"
)


def write(path, text):
    path.write_text(text)
    return path


def triples_file(path, rows):
    return write(path, "head\trelation\ttail\n" + "".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))


@pytest.fixture
def parent(tmp_path):
    import_triples(
        triples_file(tmp_path / "t.tsv", PARENT_TRIPLES),
        tmp_path / "v1",
        nodes_path=write(tmp_path / "n.csv", PARENT_NODES),
        queries_path=write(tmp_path / "q.csv", PARENT_QUERIES),
    )
    return tmp_path / "v1"


def change_files(tmp_path, triples=CHANGE_TRIPLES, nodes=CHANGE_NODES, queries=CHANGE_QUERIES):
    return {
        "triples_path": write(tmp_path / "ct.tsv", triples) if triples else None,
        "nodes_path": write(tmp_path / "cn.csv", nodes) if nodes else None,
        "queries_path": write(tmp_path / "cq.csv", queries) if queries else None,
    }


def content(kg):
    """What a dataset says, by name: edges, live nodes' texts and types, and questions with their answers."""
    names = kg.nodes.column("name").to_pylist()
    rels = kg.relations.column("name").to_pylist()
    e = kg.table("edges").to_pydict()
    edges = {(names[s], rels[r], names[d]) for s, d, r in zip(e["src"], e["dst"], e["relation"])}
    nodes = {n["name"]: (n["text"], n["type"]) for n in kg.nodes.to_pylist() if n["type"] != REMOVED_TYPE}
    questions = sorted((q["text"], q["split"], tuple(sorted(names[a] for a in q["answers"]))) for q in kg.queries.to_pylist())
    return edges, nodes, questions


def ids_by_name(kg):
    return {n["name"]: n["id"] for n in kg.nodes.to_pylist() if n["type"] != REMOVED_TYPE}


def test_an_update_equals_a_fresh_import_of_the_final_graph(tmp_path, parent):
    before = open_dataset(parent)
    fingerprint = before.fingerprint
    counts = update_dataset(parent, tmp_path / "v2", **change_files(tmp_path))
    after = open_dataset(tmp_path / "v2")

    import_triples(
        triples_file(tmp_path / "final.tsv", FINAL_TRIPLES),
        tmp_path / "fresh",
        nodes_path=write(tmp_path / "final_n.csv", FINAL_NODES),
        queries_path=write(tmp_path / "final_q.csv", FINAL_QUERIES),
    )
    assert content(after) == content(open_dataset(tmp_path / "fresh"))

    # Ids are stable: survivors keep theirs, new nodes, relations and questions come after the maximum.
    old, new = ids_by_name(before), ids_by_name(after)
    assert {name: new[name] for name in old if name != "carol"} == {name: i for name, i in old.items() if name != "carol"}
    assert sorted(new[name] for name in ("globex", "gina")) == [before.num_nodes, before.num_nodes + 1]
    removed = after.nodes.to_pylist()[old["carol"]]
    assert removed == {"id": old["carol"], "type": REMOVED_TYPE, "name": REMOVED_TYPE, "text": REMOVED_TYPE}
    assert after.relations.column("name").to_pylist() == before.relations.column("name").to_pylist() + ["mentors"]
    old_q = {q["text"]: q["id"] for q in before.queries.to_pylist()}
    new_q = {q["text"]: q["id"] for q in after.queries.to_pylist()}
    survivors = {"who does alice know", "who works at acme", "who knows someone"}
    assert {t: new_q[t] for t in survivors} == {t: old_q[t] for t in survivors}
    assert sorted(new_q[t] for t in ("who works at globex", "who does gina know")) == [5, 6]

    expected = {
        "triples_added": 3,
        "triples_removed": 1,
        "edges_removed_with_nodes": 2,
        "nodes_added": 2,
        "nodes_edited": 2,
        "nodes_removed": 1,
        "relations_added": 1,
        "queries_added": 2,
        "queries_removed": 1,
        "queries_dropped": 1,
        "answers_dropped": 2,
    }
    assert counts == expected and after.manifest["change"] == expected
    assert after.manifest["parent"] == {"fingerprint": fingerprint, "path": str(parent.resolve())}
    assert set(after.manifest["source"]["inputs"]) == {"ct.tsv", "cn.csv", "cq.csv"}
    assert open_dataset(parent).fingerprint == fingerprint  # the parent is left as it was


def test_the_command_and_a_second_update(tmp_path, parent, capsys):
    files = change_files(tmp_path)
    command = ["import", "triples", "--update", str(parent), "--triples", str(files["triples_path"])]
    command += ["--nodes", str(files["nodes_path"]), "--queries", str(files["queries_path"]), "--out", str(tmp_path / "v2")]
    assert main(command) == 0
    assert "1 queries left without answers dropped" in capsys.readouterr().err
    v2 = open_dataset(tmp_path / "v2")
    carol = ids_by_name(open_dataset(parent))["carol"]

    # A removed node cannot be named again; adding its name back makes a new node with a new id.
    nodes_only = write(tmp_path / "again.csv", "id,text,op\ncarol,Carol is back,add\n")
    assert (
        main(["import", "triples", "--update", str(tmp_path / "v2"), "--nodes", str(nodes_only), "--out", str(tmp_path / "v3")])
        == 0
    )
    v3 = open_dataset(tmp_path / "v3")
    assert ids_by_name(v3)["carol"] == v2.num_nodes and v3.nodes.column("type")[carol].as_py() == REMOVED_TYPE
    assert v3.manifest["parent"]["fingerprint"] == v2.fingerprint

    assert (
        main(["import", "triples", "--update", str(parent), "--out", str(parent), "--overwrite", "--nodes", str(nodes_only)]) == 2
    )
    assert "is the dataset being updated" in capsys.readouterr().err
    assert open_dataset(parent).num_nodes == v2.num_nodes - 2


BAD = {
    "a triple that is not there": (
        {"triples": "head\trelation\ttail\top\nalice\tknows\tbob\tremove\nalice\tknows\terin\tremove\n"},
        "ct.tsv",
        r"1 triples to remove are not edges of .*, first lines 3 \(alice knows erin\); check their names or drop those rows$",
    ),
    "an edge to a removed node": (
        {"triples": "head\trelation\ttail\top\ncarol\tknows\tbob\tadd\n", "nodes": "id,text,op\ncarol,,remove\n"},
        "ct.tsv",
        r"1 added triples name a node this change removes, first lines 2 \(carol knows bob\); drop those triples or keep the node$",
    ),
    "a triple already present": (
        {"triples": "head\trelation\ttail\top\ngina\tknows\tbob\tadd\nalice\tknows\tbob\tadd\n"},
        "ct.tsv",
        r"1 added triples are already edges of .*, first lines 3 \(alice knows bob\); drop those rows$",
    ),
    "a triple added twice": (
        {"triples": "head\trelation\ttail\top\ngina\tknows\tbob\tadd\nalice\tknows\tgina\tadd\ngina\tknows\tbob\tadd\n"},
        "ct.tsv",
        r"1 triples are listed twice, first lines 4 \(gina knows bob\); list each change once$",
    ),
    "an unknown op": (
        {"triples": "head\trelation\ttail\top\ngina\tknows\tbob\tadd\nalice\tknows\tdave\tupsert\n"},
        "ct.tsv",
        r"1 rows with an op that is not add or remove, first lines 3 \('upsert'\); write add or remove in column op$",
    ),
    "no op column": (
        {"nodes": "id,text\ngina,Gina\n"},
        "cn.csv",
        r"no column 'op' \(have: id, text\); a change set marks every row add or remove in a column op$",
    ),
    "a node that is not there": (
        {"nodes": "id,text,op\ngina,Gina,add\nzed,,remove\n"},
        "cn.csv",
        r"1 nodes to remove are not nodes of .*, first lines 3 \('zed'\); check their names or drop those rows$",
    ),
    "an added node without text": (
        {"nodes": "id,text,op\ngina,,add\n"},
        "cn.csv",
        r"1 nodes with empty text, first lines 2; give every node a text or drop its row$",
    ),
    "a question that is not there": (
        {"queries": "text,answers,op\nwho is gina,,remove\n"},
        "cq.csv",
        r"1 questions to remove are not questions of .*, first lines 2 \('who is gina'\); check their id or text$",
    ),
    "an answer that is removed": (
        {"queries": "text,answers,op\nwho knew carol,carol,add\n", "nodes": "id,text,op\ncarol,,remove\n"},
        "cq.csv",
        r"1 answers are not nodes of the graph, first at lines 2 \('carol'\); fix the answers or add those nodes$",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_change_sets_name_the_file_and_line_and_write_nothing(tmp_path, parent, case):
    files, culprit, message = BAD[case]
    kwargs = change_files(tmp_path, files.get("triples"), files.get("nodes"), files.get("queries"))
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / culprit))}: {message}") as error:
        update_dataset(parent, tmp_path / "v2", **kwargs)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "v2").exists() and not list(tmp_path.glob(".v2*"))


def test_questions_by_id_with_attributes_on_a_graph_without_questions(tmp_path):
    import_triples(triples_file(tmp_path / "t.tsv", PARENT_TRIPLES), tmp_path / "v1")
    added = write(
        tmp_path / "q1.csv", "text,answers,split,level,op\nwho knows bob,alice,train,1,add\nwho knows alice,carol,val,2,add\n"
    )
    update_dataset(tmp_path / "v1", tmp_path / "v2", queries_path=added)
    v2 = open_dataset(tmp_path / "v2")
    assert v2.queries.select(["id", "text", "level"]).to_pylist() == [
        {"id": 0, "text": "who knows bob", "level": 1},
        {"id": 1, "text": "who knows alice", "level": 2},
    ]
    assert v2.manifest["query_attributes"] == ["level"]

    changed = write(tmp_path / "q2.csv", "id,text,answers,op\n0,,,remove\n7,who likes acme,erin,add\n,who is bob,bob,add\n")
    update_dataset(tmp_path / "v2", tmp_path / "v3", queries_path=changed)
    v3 = open_dataset(tmp_path / "v3")
    rows = v3.queries.select(["id", "text", "level"]).to_pylist()
    assert rows == [
        {"id": 1, "text": "who knows alice", "level": 2},
        {"id": 7, "text": "who likes acme", "level": None},
        {"id": 8, "text": "who is bob", "level": None},
    ]

    taken = write(tmp_path / "q3.csv", "id,text,answers,op\n1,who likes acme,erin,add\n")
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(taken))}: 1 added questions have ids already taken .*first lines 2 \(ids 1\)"
    ):
        update_dataset(tmp_path / "v2", tmp_path / "v4", queries_path=taken)
    assert not (tmp_path / "v4").exists()
