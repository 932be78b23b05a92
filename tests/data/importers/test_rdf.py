"""RDF importer: five syntaxes of one ontology give one dataset; labels by language, fallbacks, blank
nodes, broken syntax, MetaQA-like triples matching the triples importer, and questions answered by IRI."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyoxigraph
import pytest

from seeder.cli.main import main
from seeder.data.importers.rdf import _Interner, import_rdf
from seeder.data.importers.triples import import_triples
from seeder.data.store import open_dataset
from seeder.system.io import DataError
from tests.data.importers.test_triples import edge_set

FILMS_TTL = """\
@prefix ex: <http://example.org/film/> .
@prefix owl: <http://www.w3.org/2002/07/owl#> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix skos: <http://www.w3.org/2004/02/skos/core#> .
@prefix schema: <http://schema.org/> .
@prefix xsd: <http://www.w3.org/2001/XMLSchema#> .

ex:Film a owl:Class ; rdfs:label "film"@en, "film"@fr ;
    rdfs:comment "A motion picture."@en, "Une œuvre cinématographique."@fr .
ex:Person a owl:Class ; rdfs:label "person"@en, "personne"@fr .
ex:Director a owl:Class ; rdfs:subClassOf ex:Person ; rdfs:label "director"@en, "réalisateur"@fr .
ex:Award a owl:Class ; rdfs:label "award"@en-GB, "prix"@fr .
ex:directedBy a owl:ObjectProperty ; rdfs:label "directed by"@en, "réalisé par"@fr ;
    rdfs:domain ex:Film ; rdfs:range ex:Director .
ex:starring a owl:ObjectProperty ; rdfs:label "starring"@en, "avec"@fr .
ex:releaseYear a owl:DatatypeProperty ; rdfs:label "release year"@en .

ex:Amelie a ex:Film, owl:NamedIndividual ;
    rdfs:label "Amélie"@en, "Le Fabuleux Destin d'Amélie Poulain"@fr ;
    rdfs:comment "A 2001 French romantic comedy."@en, "Comédie romantique française de 2001."@fr ;
    ex:directedBy ex:Jeunet ;
    ex:starring ex:Tautou, ex:Dominique%20Pinon ;
    ex:releaseYear "2001"^^xsd:gYear ;
    ex:tagline "She'll change your life."@en ;
    ex:award [ a ex:Award ; rdfs:label "César for Best Film"@en ; ex:year "2002"^^xsd:gYear ] .
ex:Delicatessen a ex:Film ; rdfs:label "Delicatessen" ;
    ex:directedBy ex:Jeunet, ex:Caro ;
    ex:starring ex:Dominique%20Pinon ;
    ex:releaseYear "1991"^^xsd:gYear .
ex:Jeunet a ex:Director ; skos:prefLabel "Jean-Pierre Jeunet" ; skos:definition "French film director."@en .
ex:Caro a ex:Director .
ex:Tautou a ex:Person, owl:NamedIndividual ; rdfs:label "Audrey Tautou"@en ;
    schema:description "French actress."@en ;
    ex:bornIn ex:Beaumont-en-Auge .
ex:Dominique%20Pinon a ex:Person .
"""

EX = "http://example.org/film/"

# The Turtle above as imported with --lang en: (name, type, text) of every node, and the edges by name.
# ex:starring and ex:releaseYear are predicates only, so no nodes; ex:directedBy is also the subject of
# rdfs:domain and rdfs:range edges, so it is one.
NODES_EN = {
    ("Amélie", "film", "A 2001 French romantic comedy."),
    ("Audrey Tautou", "person", "French actress."),
    ("Beaumont-en-Auge", "Thing", "Beaumont-en-Auge"),
    ("Caro", "director", "Caro"),
    ("Delicatessen", "film", "Delicatessen"),
    ("Dominique Pinon", "person", "Dominique Pinon"),
    ("Jean-Pierre Jeunet", "director", "French film director."),
    ("award", "Class", "award"),
    ("directed by", "ObjectProperty", "directed by"),
    ("director", "Class", "director"),
    ("film", "Class", "A motion picture."),
    ("person", "Class", "person"),
}
EDGES_EN = {
    ("Amélie", "directed by", "Jean-Pierre Jeunet"),
    ("Amélie", "starring", "Audrey Tautou"),
    ("Amélie", "starring", "Dominique Pinon"),
    ("Audrey Tautou", "bornIn", "Beaumont-en-Auge"),
    ("Delicatessen", "directed by", "Caro"),
    ("Delicatessen", "directed by", "Jean-Pierre Jeunet"),
    ("Delicatessen", "starring", "Dominique Pinon"),
    ("directed by", "domain", "film"),
    ("directed by", "range", "director"),
    ("director", "subClassOf", "person"),
}
SYNTAXES = {
    "nt": pyoxigraph.RdfFormat.N_TRIPLES,
    "nq": pyoxigraph.RdfFormat.N_QUADS,
    "ttl": pyoxigraph.RdfFormat.TURTLE,
    "trig": pyoxigraph.RdfFormat.TRIG,
    "rdf": pyoxigraph.RdfFormat.RDF_XML,
}


def write_syntaxes(folder: Path) -> dict[str, Path]:
    """The ontology in each of the five syntaxes: Turtle as written, the others through pyoxigraph's
    serializer. In N-Quads and TriG the triples about ex:A... sit in a named graph (graph names are
    ignored)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ttl": folder / "films.ttl"}
    paths["ttl"].write_text(FILMS_TTL, encoding="utf-8")
    quads = list(pyoxigraph.parse(FILMS_TTL, pyoxigraph.RdfFormat.TURTLE))
    graph = pyoxigraph.NamedNode("http://example.org/graph/films")
    named = [pyoxigraph.Quad(q.subject, q.predicate, q.object, graph) for q in quads if q.subject.value.startswith(EX + "A")]
    default = [q for q in quads if not q.subject.value.startswith(EX + "A")]
    for ext, fmt in SYNTAXES.items():
        if ext == "ttl":
            continue
        paths[ext] = folder / f"films.{ext}"
        data = named + default if fmt.supports_datasets else [q.triple for q in quads]
        pyoxigraph.serialize(data, str(paths[ext]), fmt)
    return paths


def content(path: Path):
    """A dataset's content by name: nodes (name, type, text), edges, relations (name, text, inverse)."""
    kg = open_dataset(path)
    nodes = {(r["name"], r["type"], r["text"]) for r in kg.nodes.to_pylist()}
    relations = {(r["name"], r["text"], r["inverse_text"]) for r in kg.relations.to_pylist()}
    return nodes, edge_set(kg), relations


@pytest.fixture(scope="module")
def films(tmp_path_factory) -> dict[str, Path]:
    return write_syntaxes(tmp_path_factory.mktemp("films"))


def test_five_syntaxes_give_one_dataset(films, tmp_path):
    source = import_rdf([films["ttl"]], tmp_path / "ttl")
    nodes, edges, relations = content(tmp_path / "ttl")
    assert nodes == NODES_EN and edges == EDGES_EN
    assert {r[0] for r in relations} == {"bornIn", "directed by", "domain", "range", "starring", "subClassOf"}
    assert ("directed by", "directed by", "inverse of directed by") in relations
    assert source["triples"] == 56
    assert source["skipped_literal_triples"] == 3  # two release years and a tagline
    assert source["skipped_blank_node_triples"] == 4  # the award and its type, label and year
    for ext in ("nt", "nq", "trig", "rdf"):
        other = import_rdf([films[ext]], tmp_path / ext)
        assert content(tmp_path / ext) == (nodes, edges, relations), ext
        assert other["skipped_literal_triples"] == 3 and other["skipped_blank_node_triples"] == 4
    # The Delicatessen triples stated in the default graph and a named graph too: one edge per fact.
    quads = list(pyoxigraph.parse(path=str(films["nq"])))
    graph = pyoxigraph.NamedNode("http://example.org/graph/again")
    again = [pyoxigraph.Quad(q.subject, q.predicate, q.object, graph) for q in quads if q.subject.value == EX + "Delicatessen"]
    pyoxigraph.serialize(quads + again, str(tmp_path / "twice.nq"), pyoxigraph.RdfFormat.N_QUADS)
    twice = import_rdf([tmp_path / "twice.nq"], tmp_path / "twice")
    assert len(again) == 6 and twice["triples"] == 56 + 6 and twice["duplicate_triples"] == 3  # type, label, year: no edges
    assert content(tmp_path / "twice") == (nodes, edges, relations)


def test_french_labels_and_fallbacks(films, tmp_path):
    import_rdf([films["ttl"]], tmp_path / "fr", lang="fr")
    nodes, edges, _ = content(tmp_path / "fr")
    by_name = {n: (t, x) for n, t, x in nodes}
    amelie = "Le Fabuleux Destin d'Amélie Poulain"
    assert by_name[amelie] == ("film", "Comédie romantique française de 2001.")
    assert by_name["Jean-Pierre Jeunet"] == ("réalisateur", "French film director.")  # untagged label, then any text
    assert by_name["Audrey Tautou"] == ("personne", "French actress.")  # an English label only: used
    assert by_name["prix"] == ("Class", "prix")
    assert (amelie, "réalisé par", "Jean-Pierre Jeunet") in edges and (amelie, "avec", "Audrey Tautou") in edges
    assert ("réalisateur", "subClassOf", "personne") in edges


def test_missing_labels_fall_back_to_local_names(films, tmp_path):
    import_rdf([films["ttl"]], tmp_path / "ds")
    kg = open_dataset(tmp_path / "ds")
    rows = {r["name"]: r for r in kg.nodes.to_pylist()}
    assert rows["Caro"]["type"] == "director" and rows["Caro"]["text"] == "Caro"
    assert rows["Beaumont-en-Auge"]["type"] == "Thing"  # no rdf:type
    assert "Dominique Pinon" in rows  # ex:Dominique%20Pinon: percent-escapes decoded
    assert rows["Amélie"]["type"] == "film"  # owl:NamedIndividual passed over
    assert rows["award"]["type"] == "Class"  # an en-GB label for --lang en


def test_blank_nodes_keep_and_type_edges(films, tmp_path):
    source = import_rdf([films["ttl"]], tmp_path / "keep", blank_nodes="keep")
    nodes, edges, _ = content(tmp_path / "keep")
    assert ("César for Best Film", "award", "César for Best Film") in nodes
    assert ("Amélie", "award", "César for Best Film") in edges
    assert source["skipped_blank_node_triples"] == 0
    (tmp_path / "anon.ttl").write_text(
        "@prefix ex: <http://example.org/> .\nex:a ex:knows _:x .\n_:x ex:knows [ ex:knows ex:b ] .\n"
    )
    # The parser gives anonymous blank nodes random labels; the names do not change from one import to the next.
    chains = []
    for run in ("one", "two"):
        import_rdf([tmp_path / "anon.ttl"], tmp_path / run, blank_nodes="keep")
        edges = dict((h, t) for h, _, t in edge_set(open_dataset(tmp_path / run)))
        chains.append([edges["a"], edges[edges["a"]]])
        assert sorted(chains[-1]) == ["_:b1", "_:b2"] and edges[chains[-1][1]] == "b"
    assert chains[0] == chains[1]
    import_rdf([films["ttl"]], tmp_path / "types", type_edges=True)
    nodes, edges, _ = content(tmp_path / "types")
    assert ("Amélie", "type", "film") in edges and ("Amélie", "type", "NamedIndividual") in edges
    assert ("film", "type", "Class") in edges and ("Amélie", "film", "A 2001 French romantic comedy.") in nodes


def test_chunks_and_several_files_give_the_same_dataset(films, tmp_path):
    import_rdf([films["ttl"]], tmp_path / "whole")
    import_rdf([films["nt"]], tmp_path / "chunked", chunk_rows=5)
    assert content(tmp_path / "chunked") == content(tmp_path / "whole")
    # The ontology split in two files of two syntaxes (blank-node labels are scoped to their file).
    lines = films["nt"].read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "a.nt").write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    rest = pyoxigraph.parse("".join(lines[len(lines) // 2 :]), pyoxigraph.RdfFormat.N_TRIPLES)
    pyoxigraph.serialize([q.triple for q in rest], str(tmp_path / "b.rdf"), pyoxigraph.RdfFormat.RDF_XML)
    assert main(["import", "rdf", str(tmp_path / "a.nt"), str(tmp_path / "b.rdf"), "--out", str(tmp_path / "two")]) == 0
    assert content(tmp_path / "two") == content(tmp_path / "whole")


def test_interner_batches():
    interner = _Interner(min_batch=3)
    chunks = [["a", "b", "a"], ["c", "b"], ["d", "a", "e", "c"], ["b"]]
    for chunk in chunks:
        interner.add("s", pa.array(chunk, pa.large_string()))
    ids = interner.ids("s")
    known = interner.known.to_pylist()
    assert [known[i] for i in ids] == sum(chunks, []) and known == ["a", "b", "c", "d", "e"]


def test_broken_syntax_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.nt"
    bad.write_text(
        '<http://a/x> <http://a/p> <http://a/y> .\n<http://a/x> <http://a/p> <http://a/z> .\n<http://a/x> <http://a/p> "oops .\n'
    )
    with pytest.raises(DataError, match=r"bad\.nt: line 3, column \d+: not valid N-Triples .*; fix or drop that line"):
        import_rdf([bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    bad_ttl = tmp_path / "bad.ttl"
    bad_ttl.write_text("@prefix ex: <http://a/> .\nex:x ex:p ex:y .\n\nex:x ex:p ex:z ;\n    ex:q .\n")
    with pytest.raises(DataError, match=r"bad\.ttl: line 5, column \d+: not valid Turtle"):
        import_rdf([bad_ttl], tmp_path / "out")
    owl_xml = tmp_path / "films.owl"  # OWL/XML, not RDF/XML
    owl_xml.write_text(
        '<?xml version="1.0"?>\n<Ontology xmlns="http://www.w3.org/2002/07/owl#" ontologyIRI="http://example.org/films">\n'
        '    <Declaration><Class IRI="#Film"/></Declaration>\n</Ontology>\n'
    )
    with pytest.raises(DataError, match=r"films\.owl: not valid RDF/XML \(.*\) \(an \.owl file must be RDF/XML"):
        import_rdf([owl_xml], tmp_path / "out")
    unclosed = tmp_path / "unclosed.rdf"
    unclosed.write_text(
        '<?xml version="1.0"?>\n<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns:ex="http://a/">\n'
        '  <rdf:Description rdf:about="http://a/x">\n    <ex:p rdf:resource="http://a/y">\n  </rdf:Description>\n</rdf:RDF>\n'
    )
    with pytest.raises(
        DataError, match=r"unclosed\.rdf: line 5, column 5: not valid RDF/XML \(not well-formed XML: mismatched tag\)"
    ):
        import_rdf([unclosed], tmp_path / "out")
    latin = tmp_path / "latin.nt"
    latin.write_bytes(
        b'<http://a/x> <http://a/p> <http://a/y> .\n<http://a/x> <http://www.w3.org/2000/01/rdf-schema#label> "caf\xe9" .\n'
    )
    with pytest.raises(DataError, match=r"latin\.nt: line 2, .*re-encode the file as UTF-8"):
        import_rdf([latin], tmp_path / "out")
    (tmp_path / "kb.txt").write_bytes(bad.read_bytes())
    with pytest.raises(DataError, match=r"kb\.txt: cannot tell the RDF syntax from the extension '\.txt'.*--format"):
        import_rdf([tmp_path / "kb.txt"], tmp_path / "out")
    literals = tmp_path / "literals.nt"
    literals.write_text('<http://a/x> <http://a/p> "1" .\n<http://a/x> <http://a/q> _:b .\n')
    with pytest.raises(DataError, match=r"no triple links two IRIs .*--blank-nodes keep"):
        import_rdf([literals], tmp_path / "out")
    assert main(["import", "rdf", str(bad), "--out", str(tmp_path / "cli")]) == 2


METAQA_KB = [
    ("Kismet", "directed_by", "William Dieterle"),
    ("Kismet", "written_by", "Edward Knoblock"),
    ("Kismet", "starred_actors", "Marlene Dietrich"),
    ("Kismet", "starred_actors", "Edward Arnold"),
    ("Kismet", "release_year", "1944"),
    ("Kismet", "in_language", "English"),
    ("Flags of Our Fathers", "directed_by", "Clint Eastwood"),
    ("Flags of Our Fathers", "written_by", "William Broyles Jr."),
    ("Flags of Our Fathers", "has_genre", "War"),
    ("Flags of Our Fathers", "release_year", "2006"),
    ("Letters from Iwo Jima", "directed_by", "Clint Eastwood"),
    ("Letters from Iwo Jima", "in_language", "Japanese"),
    ("Letters from Iwo Jima", "release_year", "2006"),
    ("Letters from Iwo Jima", "has_tags", "clint eastwood"),
    ("Kismet", "directed_by", "William Dieterle"),  # listed twice, as in MetaQA's kb.txt
]


def entity(name: str) -> str:
    return f"http://example.org/entity/{quote(name, safe='')}"


def test_metaqa_like_ntriples_match_the_triples_importer(tmp_path):
    (tmp_path / "kb.tsv").write_text("head\trelation\ttail\n" + "".join(f"{h}\t{r}\t{t}\n" for h, r, t in METAQA_KB))
    (tmp_path / "kb.nt").write_text(
        "".join(f"<{entity(h)}> <http://example.org/relation/{r}> <{entity(t)}> .\n" for h, r, t in METAQA_KB)
    )
    (tmp_path / "q.tsv").write_text(
        "text\tanswers\tsplit\n"
        "who directed Kismet\tWilliam Dieterle\ttrain\n"
        "which films did Clint Eastwood direct\tFlags of Our Fathers|Letters from Iwo Jima\ttest\n"
    )
    (tmp_path / "q_iri.tsv").write_text(
        "text\tanswers\tsplit\n"
        f"who directed Kismet\t<{entity('William Dieterle')}>\ttrain\n"
        f"which films did Clint Eastwood direct\t{entity('Flags of Our Fathers')}|Letters from Iwo Jima\ttest\n"
    )
    triples = import_triples(tmp_path / "kb.tsv", tmp_path / "tsv", queries_path=tmp_path / "q.tsv")
    rdf = import_rdf([tmp_path / "kb.nt"], tmp_path / "rdf", queries_path=tmp_path / "q_iri.tsv")
    a, b = open_dataset(tmp_path / "tsv"), open_dataset(tmp_path / "rdf")
    assert b.manifest["counts"] == a.manifest["counts"] == {"nodes": 15, "relations": 7, "edges": 14, "queries": 2}
    assert rdf["duplicate_triples"] == triples["duplicate_triples"] == 1
    assert edge_set(b) == edge_set(a)
    assert set(b.nodes.column("name").to_pylist()) == set(a.nodes.column("name").to_pylist())
    assert b.relations.select(["name", "text", "inverse_text"]).equals(a.relations.select(["name", "text", "inverse_text"]))

    def answers(kg):
        names = kg.nodes.column("name").to_pylist()
        return [(q["text"], q["split"], sorted(names[i] for i in q["answers"])) for q in kg.queries.to_pylist()]

    assert answers(b) == answers(a)


def test_query_answers_by_iri_or_name_and_their_errors(films, tmp_path):
    (tmp_path / "q.csv").write_text(
        "text,answers\n"
        f"who directed Amélie,<{EX}Jeunet>\n"
        f"who starred in Delicatessen,{EX}Dominique%20Pinon\n"
        "which films did Jeunet direct,Amélie|Delicatessen\n"
    )
    import_rdf([films["ttl"]], tmp_path / "ds", queries_path=tmp_path / "q.csv", val_fraction=0.0, test_fraction=0.0)
    kg = open_dataset(tmp_path / "ds")
    names = kg.nodes.column("name").to_pylist()
    got = [sorted(names[i] for i in q["answers"]) for q in kg.queries.to_pylist()]
    assert got == [["Jean-Pierre Jeunet"], ["Dominique Pinon"], ["Amélie", "Delicatessen"]]
    assert np.all(kg.queries.column("split").to_numpy(zero_copy_only=False) == "train")

    (tmp_path / "unknown.csv").write_text(f"text,answers\nok,{EX}Caro\nwho,{EX}Nobody\n")
    with pytest.raises(DataError, match=r"unknown\.csv: 1 answers are not nodes of the graph, first at lines 3"):
        import_rdf([films["ttl"]], tmp_path / "x", queries_path=tmp_path / "unknown.csv")
    (tmp_path / "twice.ttl").write_text(
        "@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .\n<http://a/1> <http://a/p> <http://a/2> .\n"
        '<http://a/1> rdfs:label "Paris" .\n<http://a/2> rdfs:label "Paris" .\n'
    )
    (tmp_path / "shared.csv").write_text("text,answers\nwhere,Paris\n")
    with pytest.raises(
        DataError, match=r"shared\.csv: 1 answers name several nodes, first at lines 2 .*give those answers as IRIs"
    ):
        import_rdf([tmp_path / "twice.ttl"], tmp_path / "x", queries_path=tmp_path / "shared.csv")


def test_without_the_rdf_extra_the_import_says_how_to_install_it(films, tmp_path, monkeypatch):
    from seeder.data.importers import rdf

    monkeypatch.setattr(rdf, "pyoxigraph", None)
    with pytest.raises(DataError, match=r"pip install 'seeder\[rdf\]'"):
        import_rdf([films["ttl"]], tmp_path / "out")
    assert not (tmp_path / "out").exists()
