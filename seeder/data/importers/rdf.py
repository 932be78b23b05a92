"""RDF: N-Triples, N-Quads, Turtle, TriG and RDF/XML files, read with pyoxigraph's parser.

The mapping (also in docs/own-graph.md, "RDF"):

- Nodes: the IRIs that are subjects or IRI objects. An IRI used as a predicate is a relation; it becomes a
  node too only where it is the subject or object of an edge (``ex:directedBy rdfs:domain ex:Film``), so
  that a property's own label and type do not add a node.
- A node's name is its ``rdfs:label`` or ``skos:prefLabel`` in the chosen language (``en-GB`` counts as
  ``en``, after an exact ``en``), else one without a language tag, else any label, else the IRI's local
  name (after the last ``#`` or ``/``, percent-escapes decoded). Its text is its ``rdfs:comment``,
  ``skos:definition`` or ``schema:description`` by the same rule, else its name. Among equal candidates
  the smallest value wins, so the result does not depend on the order of the triples in the file.
- A node's type comes from ``rdf:type``: the type's label (same rule) or local name; with several types,
  the first name in sorted order, passing over ``owl:NamedIndividual``, ``owl:Thing`` and
  ``rdfs:Resource`` when there is another; with none, ``Thing``. ``type_edges`` keeps the ``rdf:type``
  triples as edges too.
- Predicates whose objects are IRIs become relations, named by the predicate's label if the files give
  one, else its local name (two predicates of one name get their IRI in brackets after it).
- Literals never become nodes: labels and descriptions are consumed as above, every other literal-valued
  triple is skipped and counted. A label or description predicate with an IRI object is no edge either
  (counted apart, as are RDF 1.2 triple terms).
- Blank nodes: ``skip`` (default) drops every triple with a blank-node subject or object, and counts
  them; ``keep`` makes them nodes named by their label, else ``_:b1``, ``_:b2``, ... in an order fixed
  by the file (parsers give anonymous blank nodes random labels, and an import must give the same
  dataset every time). Blank-node labels are scoped to their file.
- N-Quads and TriG: graph names are ignored; a triple stated in several graphs is one edge.

Triples stream through the parser in chunks of columns; interning, labels, types and edges are worked
out with Arrow and numpy per chunk, so memory follows the number of distinct terms and edges, not the
size of the text. Questions come in the triples importer's queries file, with answers given by IRI (in
``<>`` or bare) or by a node's name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote
from xml.parsers import expat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:  # the [rdf] extra: only `seeder import rdf` needs it
    import pyoxigraph
except ImportError:  # pragma: no cover - the test extra installs it
    pyoxigraph = None

from seeder.data.importers import first_examples, lookup, progress, require_file
from seeder.data.importers.triples import as_strings, empty_queries, read_query_table, relation_table, resolve_queries
from seeder.data.store import IRI_FIELD, write_dataset
from seeder.system.io import DataError, fingerprint_file, writes_output
from seeder.system.progress import Progress

RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
RDFS = "http://www.w3.org/2000/01/rdf-schema#"
OWL = "http://www.w3.org/2002/07/owl#"
SKOS = "http://www.w3.org/2004/02/skos/core#"

RDF_TYPE = RDF + "type"
LABEL_PREDICATES = (RDFS + "label", SKOS + "prefLabel")
TEXT_PREDICATES = (RDFS + "comment", SKOS + "definition", "http://schema.org/description", "https://schema.org/description")
GENERIC_TYPES = (OWL + "NamedIndividual", OWL + "Thing", RDFS + "Resource")
DEFAULT_TYPE = "Thing"
# Position in this array: 0 rdf:type, then the label predicates, then the description predicates.
_CONSUMED = pa.array([RDF_TYPE, *LABEL_PREDICATES, *TEXT_PREDICATES], pa.large_string())
_FIRST_TEXT = 1 + len(LABEL_PREDICATES)

FORMATS = {"nt": "N_TRIPLES", "nq": "N_QUADS", "ttl": "TURTLE", "trig": "TRIG", "rdfxml": "RDF_XML"}
"""``--format`` names (and pyoxigraph's ``RdfFormat`` of each); a file's extension picks one of these
when no format is given."""
EXTENSIONS = {"nt": "nt", "nq": "nq", "ttl": "ttl", "trig": "trig", "rdf": "rdfxml", "owl": "rdfxml", "xml": "rdfxml"}
BLANK_NODES = ("skip", "keep")
CHUNK_ROWS = 1 << 17
"""Triples collected from the parser before they are turned into columns."""


def rdf_format(path: Path, name: str | None = None) -> pyoxigraph.RdfFormat:
    """The syntax of ``path``: ``name`` (a key of FORMATS) when given, else from the file's extension."""
    if pyoxigraph is None:
        raise DataError("reading RDF needs pyoxigraph: pip install 'seeder[rdf]'")
    if name is not None:
        if name not in FORMATS:
            raise DataError(f"unknown RDF format '{name}'; use one of {', '.join(FORMATS)}")
        return getattr(pyoxigraph.RdfFormat, FORMATS[name])
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in EXTENSIONS:
        raise DataError(
            f"{path}: cannot tell the RDF syntax from the extension '{path.suffix}'; name the file "
            f".{', .'.join(EXTENSIONS)} or pass --format ({', '.join(FORMATS)})"
        )
    return getattr(pyoxigraph.RdfFormat, FORMATS[EXTENSIONS[suffix]])


def _syntax_error(path: Path, fmt: pyoxigraph.RdfFormat, exc: SyntaxError) -> DataError:
    """pyoxigraph's SyntaxError as a one-line DataError naming the file, the line and the fix."""
    reason = re.sub(r"^Parser error (?:at|between) line \d+ column \d+(?: and line \d+ column \d+)?: ", "", str(exc.msg))
    if "UTF-8" in reason:
        fix = "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    else:
        fix = "fix or drop that line"
    line, column = exc.lineno, exc.offset
    if not line and fmt == pyoxigraph.RdfFormat.RDF_XML:
        # The RDF/XML parser reports no position; expat finds that of a well-formedness error.
        line, column, xml_reason = _xml_error(path) or (None, None, None)
        reason = xml_reason or reason
    if line:
        return DataError(f"{path}: line {line}, column {column}: not valid {fmt.name} ({reason}); {fix}")
    hint = ""
    if fmt == pyoxigraph.RdfFormat.RDF_XML and path.suffix.lower() == ".owl":
        hint = " (an .owl file must be RDF/XML: save OWL/XML, Manchester or functional syntax as RDF/XML or Turtle first)"
    return DataError(f"{path}: not valid {fmt.name} ({reason}){hint}; fix the file")


def _xml_error(path: Path) -> tuple[int, int, str] | None:
    """(line, column, reason) of the first XML well-formedness error in ``path``; None for well-formed XML."""
    parser = expat.ParserCreate()
    with open(path, "rb") as fh:
        try:
            parser.ParseFile(fh)
        except expat.ExpatError as exc:
            return exc.lineno, exc.offset + 1, f"not well-formed XML: {expat.ErrorString(exc.code)}"
    return None


def _parse(path: Path, fmt: pyoxigraph.RdfFormat, base_iri: str | None, chunk_rows: int) -> Iterator[tuple]:
    """The triples of one file as columns, ``chunk_rows`` at a time, with the bytes read so far.

    Columns: subject and non-literal object in N-Triples form (``<iri>``, ``_:id``), predicate IRI,
    literal value, whether the object is a literal, and the literal's language (None without one). The
    one Python loop per triple is the parser's own iteration; all else works on the columns.
    """
    literal = pyoxigraph.Literal
    with open(path, "rb") as fh:
        try:
            quads = pyoxigraph.parse(fh, fmt, base_iri=base_iri)
            while True:
                subjects, predicates, objects, is_literal, languages = [], [], [], [], []
                for quad in islice(quads, chunk_rows):
                    subjects.append(str(quad.subject))
                    predicates.append(quad.predicate.value)
                    obj = quad.object
                    if type(obj) is literal:
                        objects.append(obj.value)
                        is_literal.append(True)
                        languages.append(obj.language)
                    else:
                        objects.append(str(obj))
                        is_literal.append(False)
                        languages.append(None)
                if not subjects:
                    return
                yield subjects, predicates, objects, is_literal, languages, fh.tell()
        except SyntaxError as exc:
            raise _syntax_error(path, fmt, exc) from None
        except OSError as exc:
            raise DataError(f"{path}: cannot read ({exc})") from None


def _mask(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, null read as False."""
    return np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class _Interner:
    """Dense int32 ids for strings that arrive in chunks, in first-seen order, through Arrow's hash tables
    instead of a Python dict per string.

    Strings are held back per named stream and interned together once there are at least as many as
    known strings: each batch pays one hash table over the known strings, so the cost stays linear in
    the strings added. ``ids(stream)`` gives the ids of everything added to ``stream``, in order.
    """

    def __init__(self, min_batch: int = 1 << 20):
        self.known = pa.array([], pa.large_string())
        self.min_batch = min_batch
        self._pending: list[tuple[str, pa.Array]] = []
        self._pending_rows = 0
        self._ids: dict[str, list[np.ndarray]] = {}

    def add(self, stream: str, keys: pa.Array) -> None:
        self._pending.append((stream, keys))
        self._pending_rows += len(keys)
        if self._pending_rows >= max(self.min_batch, len(self.known)):
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = pa.concat_arrays([keys for _, keys in self._pending])
        fresh = pc.unique(batch)
        fresh = fresh.filter(pa.array(lookup(fresh, self.known) < 0))
        self.known = pa.concat_arrays([self.known, fresh])
        ids = lookup(batch, self.known).astype(np.int32)
        start = 0
        for stream, keys in self._pending:
            self._ids.setdefault(stream, []).append(ids[start : start + len(keys)])
            start += len(keys)
        self._pending, self._pending_rows = [], 0

    def ids(self, stream: str) -> np.ndarray:
        self._flush()
        parts = self._ids.get(stream, [])
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)


class _Best:
    """The best (lowest rank, then smallest value) literal per key, kept reduced as chunks arrive."""

    def __init__(self):
        self._tables: list[pa.Table] = []
        self._rows = 0
        self._reduced_rows = 0

    def add(self, keys: pa.Array, values: pa.Array, rank: np.ndarray) -> None:
        if not len(keys):
            return
        table = _first_per_key(pa.table({"key": keys, "value": values, "rank": pa.array(rank, pa.int8())}))
        self._tables.append(table)
        self._rows += table.num_rows
        if self._rows > 2 * self._reduced_rows + (1 << 20):
            self._reduce()

    def _reduce(self) -> None:
        if len(self._tables) > 1:
            self._tables = [_first_per_key(pa.concat_tables(self._tables))]
        self._rows = self._reduced_rows = sum(t.num_rows for t in self._tables)

    def result(self) -> tuple[pa.Array, pa.Array]:
        """(keys, values), one row per key."""
        self._reduce()
        if not self._tables:
            return pa.array([], pa.large_string()), pa.array([], pa.string())
        table = self._tables[0]
        return table.column("key").combine_chunks(), table.column("value").combine_chunks()


def _first_per_key(table: pa.Table) -> pa.Table:
    table = table.sort_by([("key", "ascending"), ("rank", "ascending"), ("value", "ascending")])
    keys = table.column("key").combine_chunks()
    first = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        first[1:] = _mask(pc.not_equal(keys[1:], keys[:-1]))
    return table.filter(pa.array(first))


def _language_rank(languages: pa.Array, lang: str) -> np.ndarray:
    """0: the chosen language exactly; 1: one of its regional forms (en-GB for en); 2: no language tag;
    3: another language."""
    lowered = pc.utf8_lower(languages)
    exact = _mask(pc.equal(lowered, lang))
    regional = _mask(pc.starts_with(lowered, lang + "-"))
    untagged = _mask(pc.or_kleene(pc.is_null(languages), pc.equal(languages, "")))
    return np.select([exact, regional, untagged], [0, 1, 2], 3).astype(np.int8)


def _term_keys(terms: pa.Array, blank: np.ndarray, file_index: int) -> pa.Array:
    """``<iri>`` -> the IRI; ``_:id`` -> ``_:<file>:id`` (blank-node labels are scoped to their file)."""
    iris = pc.utf8_slice_codeunits(terms, 1, -1)
    if not blank.any():
        return iris
    prefix = pa.scalar(f"_:{file_index}:", pa.large_string())
    blanks = pc.binary_join_element_wise(prefix, pc.utf8_slice_codeunits(terms, 2), pa.scalar("", pa.large_string()))
    return pc.if_else(pa.array(blank), blanks, iris)


@dataclass
class _Collector:
    """What the chunks of every file add up to: interned terms per role, best labels and descriptions,
    and the counts of skipped triples."""

    lang: str
    keep_blank: bool
    type_edges: bool
    terms: _Interner = field(default_factory=_Interner)
    labels: _Best = field(default_factory=_Best)
    texts: _Best = field(default_factory=_Best)
    triples: int = 0
    skipped_literal: int = 0
    skipped_blank: int = 0
    skipped_annotation: int = 0
    skipped_triple_terms: int = 0
    # Provenance of each edge (``seeder.data.provenance``): its file, and its triple's number there.
    edge_file: list[np.ndarray] = field(default_factory=list)
    edge_row: list[np.ndarray] = field(default_factory=list)

    def add(self, subjects, predicates, objects, is_literal, languages, file_index: int, first_triple: int = 1) -> None:
        """One chunk of a file's triples, the first of them its ``first_triple``-th (from 1)."""
        s = pa.array(subjects, pa.large_string())
        p = pa.array(predicates, pa.large_string())
        o = pa.array(objects, pa.large_string())
        literal = np.array(is_literal, dtype=bool)
        self.triples += len(s)

        s_blank = _mask(pc.starts_with(s, "_:"))
        o_blank = ~literal & _mask(pc.starts_with(o, "_:"))
        o_triple = ~literal & _mask(pc.starts_with(o, "<<"))  # an RDF 1.2 triple term: no node to map it to
        code = lookup(p, _CONSUMED)
        is_type = code == 0
        is_label = (code >= 1) & (code < _FIRST_TEXT)
        is_text = code >= _FIRST_TEXT
        # rdf:type with a blank-node object (an OWL restriction) names no type, in either mode.
        blank = (s_blank | o_blank) if not self.keep_blank else (is_type & o_blank)
        keep = ~blank & ~o_triple
        self.skipped_blank += int(blank.sum())
        self.skipped_triple_terms += int((o_triple & ~blank).sum())

        s_key = _term_keys(s, s_blank & keep, file_index)
        self.terms.add("subjects", pc.unique(s_key.filter(pa.array(keep))))
        self.terms.add("predicates", pc.unique(p.filter(pa.array(keep))))

        lit = keep & literal
        languages = pa.array(languages, pa.string())
        self.skipped_literal += int((lit & ~is_label & ~is_text).sum())
        for best, rows, first_code in ((self.labels, lit & is_label, 1), (self.texts, lit & is_text, _FIRST_TEXT)):
            if not rows.any():
                continue
            take = pa.array(rows)
            values = pc.utf8_trim_whitespace(o.filter(take)).cast(pa.string())
            rank = _language_rank(languages.filter(take), self.lang) * 8 + (code[rows] - first_code)
            nonempty = pa.array(_mask(pc.greater(pc.utf8_length(values), 0)))
            best.add(s_key.filter(take).filter(nonempty), values.filter(nonempty), rank[_mask(nonempty)])

        node_object = keep & ~literal
        self.skipped_annotation += int((node_object & (is_label | is_text)).sum())
        o_key = _term_keys(o, o_blank & node_object, file_index)
        types = node_object & is_type
        if types.any():
            take = pa.array(types)
            self.terms.add("type_s", s_key.filter(take))
            self.terms.add("type_t", o_key.filter(take))
        edges = node_object & ((code < 0) | (is_type & self.type_edges))
        if edges.any():
            take = pa.array(edges)
            self.terms.add("edge_s", s_key.filter(take))
            self.terms.add("edge_p", p.filter(take))
            self.terms.add("edge_o", o_key.filter(take))
            rows = np.flatnonzero(edges)
            self.edge_file.append(np.full(rows.size, file_index, dtype=np.int32))
            self.edge_row.append(rows + first_triple)


def _local_names(iris: pa.Array) -> pa.Array:
    """The part of each IRI after its last ``#`` or ``/`` (a trailing one ignored), percent-escapes
    decoded; the whole IRI where that part is empty."""
    local = pc.struct_field(pc.extract_regex(iris, r"(?P<local>[^/#]*)[/#]*$"), [0])
    local = pc.utf8_trim_whitespace(local.fill_null(""))
    local = pc.if_else(pc.equal(pc.utf8_length(local), 0), iris, local).cast(pa.string())
    escaped = np.flatnonzero(_mask(pc.match_substring(local, "%")))
    if not escaped.size:
        return local
    values = local.to_numpy(zero_copy_only=False).copy()
    for i in escaped:  # only the names with a percent-escape, once per term
        try:
            decoded = unquote(values[i], errors="strict").strip()
        except UnicodeDecodeError:
            continue
        values[i] = decoded or values[i]
    return pa.array(values, pa.string())


def _pick(keys: pa.Array, best: tuple[pa.Array, pa.Array], fallback: pa.Array) -> pa.Array:
    """The best literal of each key where there is one, else ``fallback``."""
    best_keys, best_values = best
    row = lookup(keys, best_keys)
    found = pa.array(row >= 0)
    chosen = best_values.take(pa.array(np.maximum(row, 0))) if len(best_values) else fallback
    return pc.if_else(found, chosen, fallback).cast(pa.string())


def _names(keys: pa.Array, labels: tuple[pa.Array, pa.Array]) -> pa.Array:
    """Names of IRIs (and blank-node keys): label, else local name."""
    return _pick(keys, labels, _local_names(keys))


def _node_types(
    node_of_term: np.ndarray, type_s: np.ndarray, type_t: np.ndarray, terms: pa.Array, labels, num_nodes: int
) -> pa.Array:
    types = np.full(num_nodes, DEFAULT_TYPE, dtype=object)
    node = node_of_term[type_s]
    typed = node >= 0
    if not typed.any():
        return pa.array(types, pa.string())
    pairs = np.unique(np.stack([node[typed].astype(np.int64), type_t[typed].astype(np.int64)], axis=1), axis=0)
    type_terms, position = np.unique(pairs[:, 1], return_inverse=True)
    type_keys = terms.take(pa.array(type_terms))
    type_names = _names(type_keys, labels)
    generic = _mask(pc.is_in(type_keys, value_set=pa.array(GENERIC_TYPES, pa.large_string())))
    table = pa.table(
        {
            "key": pa.array(pairs[:, 0]),
            "rank": pa.array(generic[position].astype(np.int8)),
            "value": type_names.take(pa.array(position)),
        }
    )
    best = _first_per_key(table)
    types[best.column("key").to_numpy()] = best.column("value").to_numpy(zero_copy_only=False)
    return pa.array(types, pa.string())


def _relations(rel_terms: np.ndarray, terms: pa.Array, labels) -> tuple[pa.Table, np.ndarray]:
    """The relations table (sorted by name) and the relation id of each of ``rel_terms``."""
    keys = terms.take(pa.array(rel_terms))
    names = _names(keys, labels)
    pairs = list(zip(names.to_pylist(), keys.to_pylist()))  # one per predicate: a few hundred at most
    order = np.array(sorted(range(len(pairs)), key=pairs.__getitem__), dtype=np.int64)
    keys, names = keys.take(pa.array(order)), names.take(pa.array(order))
    relations = relation_table(names)
    values = names.to_numpy(zero_copy_only=False).astype(object)
    uniq, counts = np.unique(values, return_counts=True)
    clash = np.isin(values, uniq[counts > 1])
    if clash.any():  # two predicates of one name: each keeps its IRI beside the name
        iris = keys.to_numpy(zero_copy_only=False)
        values[clash] = [f"{n} ({i})" for n, i in zip(values[clash], iris[clash])]
        relations = relations.set_column(1, "name", pa.array(values, pa.string()))
    rel_of = np.empty(len(rel_terms), dtype=np.int32)
    rel_of[order] = np.arange(len(rel_terms), dtype=np.int32)
    return relations.append_column(IRI_FIELD, keys.cast(pa.string())), rel_of


def _dedupe_edges(src: np.ndarray, rel: np.ndarray, dst: np.ndarray, num_nodes: int, num_relations: int) -> np.ndarray:
    """Rows of the first occurrence of each (src, relation, dst), in input order."""
    if num_nodes * num_nodes * max(num_relations, 1) < 2**62:
        key = (src.astype(np.int64) * num_relations + rel) * num_nodes + dst
        _, first = np.unique(key, return_index=True)
    else:
        _, first = np.unique(np.stack([src, rel.astype(np.int64), dst], axis=1), axis=0, return_index=True)
    first.sort()
    return first


def queries_by_iri(table: pa.Table, path: Path, keys: pa.Array, names: pa.Array) -> pa.Table:
    """A queries file's rows with each answer written as an IRI (``<iri>`` or bare) or as a node's name
    rewritten to the node's key, for ``resolve_queries``. A name shared by several nodes is an error
    naming the line; an answer that is neither stays as written (``resolve_queries`` reports it)."""
    if "answers" not in table.column_names:
        return table
    lists = pc.split_pattern(as_strings(table, "answers", path).fill_null(""), "|")
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    bracketed = pc.and_(pc.starts_with(flat, "<"), pc.ends_with(flat, ">"))
    flat = pc.if_else(bracketed, pc.utf8_slice_codeunits(flat, 1, -1), flat)
    by_key = lookup(flat, keys)
    by_name = np.where(by_key < 0, lookup(flat, names), -1)
    if (by_name >= 0).any():
        counts = pc.value_counts(names)
        several = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
        shared = _mask(pc.is_in(flat, value_set=several)) & (by_name >= 0)
        if shared.any():
            owner = np.repeat(np.arange(table.num_rows), pc.list_value_length(lists).to_numpy())
            lines = owner[shared] + 2
            raise DataError(
                f"{path}: {int(shared.sum())} answers name several nodes, first at lines {first_examples(lines)} "
                f"({', '.join(repr(v) for v in flat.filter(pa.array(shared)).to_pylist()[:5])}); give those answers as IRIs"
            )
        flat = pc.if_else(pa.array(by_name >= 0), keys.take(pa.array(np.maximum(by_name, 0))).cast(pa.string()), flat)
    offsets = lists.offsets
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, flat.cast(pa.string())), "|")
    return table.set_column(table.column_names.index("answers"), "answers", joined)


@writes_output
def import_rdf(
    files: str | Path | list[str | Path],
    out: str | Path,
    queries_path: str | Path | None = None,
    lang: str = "en",
    rdf_format_name: str | None = None,
    blank_nodes: str = "skip",
    type_edges: bool = False,
    base_iri: str | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    overwrite: bool = False,
    chunk_rows: int = CHUNK_ROWS,
) -> dict[str, Any]:
    """Import RDF files (and an optional queries file) into dataset directory ``out``.

    ``rdf_format_name``: a key of FORMATS for every file, else each file's extension decides.
    ``base_iri``: resolves relative IRIs (default: each file's own ``file://`` URI).
    """
    if blank_nodes not in BLANK_NODES:
        raise DataError(f"--blank-nodes must be one of {', '.join(BLANK_NODES)}, not '{blank_nodes}'")
    lang = lang.strip().lower()
    if not lang:
        raise DataError("--lang must name a language tag such as en or fr")
    paths = [require_file(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not paths:
        raise DataError("no RDF files given; name at least one .nt, .nq, .ttl, .trig or .rdf file")
    formats = [rdf_format(path, rdf_format_name) for path in paths]

    collector = _Collector(lang=lang, keep_blank=blank_nodes == "keep", type_edges=type_edges)
    total_bytes = sum(path.stat().st_size for path in paths)
    bar = Progress(max(1, math.ceil(total_bytes / 1e6)), "rdf: parse", unit="MB")
    read_before = 0
    with bar:
        for index, (path, fmt) in enumerate(zip(paths, formats)):
            progress(f"rdf: reading {path} ({fmt.name})")
            base = base_iri if base_iri is not None else path.resolve().as_uri()
            first_triple = 1
            for *columns, position in _parse(path, fmt, base, chunk_rows):
                collector.add(*columns, file_index=index, first_triple=first_triple)
                first_triple += len(columns[0])
                bar.update(max(0, int((read_before + position) / 1e6) - bar.done), triples=f"{collector.triples:,}")
            read_before += path.stat().st_size
    if collector.triples == 0:
        raise DataError(f"{', '.join(map(str, paths))}: no triples; the files hold no RDF statements")

    terms = collector.terms
    edge_s, edge_p, edge_o = terms.ids("edge_s"), terms.ids("edge_p"), terms.ids("edge_o")
    type_s, type_t = terms.ids("type_s"), terms.ids("type_t")
    subjects, predicates = terms.ids("subjects"), terms.ids("predicates")
    known = terms.known
    if edge_s.size == 0:
        raise DataError(
            f"{', '.join(map(str, paths))}: no triple links two IRIs ({collector.skipped_literal:,} literal and "
            f"{collector.skipped_blank:,} blank-node triples skipped); a graph needs IRI-to-IRI triples"
            + (" (or --blank-nodes keep)" if collector.skipped_blank and blank_nodes == "skip" else "")
        )

    is_node = np.zeros(len(known), dtype=bool)
    is_node[edge_s] = is_node[edge_o] = True
    is_predicate = np.zeros(len(known), dtype=bool)
    is_predicate[predicates] = True
    is_node[subjects[~is_predicate[subjects]]] = True
    node_terms = np.flatnonzero(is_node)
    node_keys = known.take(pa.array(node_terms))
    blank = _mask(pc.starts_with(node_keys, "_:"))
    # IRIs in sorted order (the same dataset whatever the order of the triples), then blank nodes as first seen.
    iri_rows = np.flatnonzero(~blank)
    iri_order = iri_rows[pc.array_sort_indices(node_keys.take(pa.array(iri_rows))).to_numpy()]
    order = np.concatenate([iri_order, np.flatnonzero(blank)])
    node_terms, node_keys, blank = node_terms[order], node_keys.take(pa.array(order)), blank[order]
    num_nodes = len(node_terms)
    node_of_term = np.full(len(known), -1, dtype=np.int64)
    node_of_term[node_terms] = np.arange(num_nodes)

    labels, texts = collector.labels.result(), collector.texts.result()
    fallback = _local_names(node_keys)
    if blank.any():
        blank_names = pa.array([f"_:b{i}" for i in range(1, int(blank.sum()) + 1)], pa.string())
        fallback = pc.replace_with_mask(fallback, pa.array(blank), blank_names)
    names = _pick(node_keys, labels, fallback)
    nodes = pa.table(
        {
            "id": pa.array(np.arange(num_nodes, dtype=np.int64)),
            "type": _node_types(node_of_term, type_s, type_t, known, labels, num_nodes),
            "name": names,
            "text": _pick(node_keys, texts, names),
            "iri": pc.if_else(pa.array(blank), pa.nulls(num_nodes, pa.string()), node_keys.cast(pa.string())),
        }
    )

    rel_terms, rel_position = np.unique(edge_p, return_inverse=True)
    relations, rel_of = _relations(rel_terms, known, labels)
    src, dst, rel = node_of_term[edge_s], node_of_term[edge_o], rel_of[rel_position]
    first = _dedupe_edges(src, rel, dst, num_nodes, relations.num_rows)
    duplicates = len(src) - first.size
    edge_file, edge_row = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in (collector.edge_file, collector.edge_row))
    edges = pa.table(
        {
            "src": src[first],
            "dst": dst[first],
            "relation": rel[first],
            "source_file": edge_file[first].astype(np.int32),
            "source_row": edge_row[first].astype(np.int64),
        }
    )
    progress(
        f"rdf: {nodes.num_rows:,} nodes, {relations.num_rows} relations, {edges.num_rows:,} edges from "
        f"{collector.triples:,} triples; skipped {collector.skipped_literal:,} literal and "
        f"{collector.skipped_blank:,} blank-node triples; {duplicates:,} duplicate triples dropped"
    )

    inputs: dict[str, str] = {}
    # A triple is known by its number in its file, in the parser's order (its line, in N-Triples with
    # one statement a line and no comments), and by its IRIs.
    edge_sources = []
    for path in paths:
        name = path.name if path.name not in inputs else str(path)
        inputs[name] = fingerprint_file(path)
        edge_sources.append({"file": name, "unit": "triple"})
    if queries_path is not None:
        queries_path = require_file(queries_path)
        keys = node_keys.cast(pa.string())
        table = queries_by_iri(read_query_table(queries_path), queries_path, keys, names)
        queries = resolve_queries(table, queries_path, keys, val_fraction, test_fraction)
        inputs[queries_path.name] = fingerprint_file(queries_path)
    else:
        queries = empty_queries()
    source = {
        "format": "rdf",
        "files": [str(p) for p in paths],
        "syntaxes": [fmt.name for fmt in formats],
        "inputs": inputs,
        "lang": lang,
        "blank_nodes": blank_nodes,
        "type_edges": type_edges,
        "triples": collector.triples,
        "skipped_literal_triples": collector.skipped_literal,
        "skipped_blank_node_triples": collector.skipped_blank,
        "skipped_annotation_triples": collector.skipped_annotation,
        "skipped_triple_terms": collector.skipped_triple_terms,
        "duplicate_triples": int(duplicates),
    }
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite, edge_sources=edge_sources)
    progress(f"rdf: wrote {out}: {queries.num_rows:,} queries")
    return source
