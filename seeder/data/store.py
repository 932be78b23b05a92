"""The on-disk knowledge-graph store: one directory per dataset, Parquet tables plus a manifest.

Layout of a dataset directory::

    manifest.json          schema version, counts, content fingerprints (written last)
    nodes.parquet          id int64 (0..N-1), type string, name string, text string
    relations.parquet      id int32 (0..R-1), name string, text string, inverse_text string
    edges.parquet          src int64, dst int64, relation int32
                           [+ source_file int32, source_row int64: where each triple came from]
    queries.parquet        id int64, text string, answers list<int64>, split string, + attributes
    adjacency/             CSR over both directions, memory-mapped by every reader:
        indptr.npy         int64 [N+1]
        neighbors.npy      int32 [2E]
        relations.npy      int32 [2E]: r for u -r-> v, r + R for the inverse v <-r- u

Inverse relations get their own ids (``r + R``) and texts, so an expansion that walks edges in
both directions still knows which way it went. The CSR is built once, at import, with vectorised
numpy, and read with ``mmap_mode="r"``: Ray workers on one machine share the page cache instead of
copying the graph per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seeder.system.io import DataError, atomic_directory, fingerprint_file, fingerprint_json, now, read_manifest, write_manifest
from seeder.system.storage import fetch

SCHEMA_VERSION = 2
"""2: each CSR slice ordered by edge hash (``build_csr``); 1 had it in input order."""
SPLITS = ("train", "val", "test")

NODE_SCHEMA = pa.schema([("id", pa.int64()), ("type", pa.string()), ("name", pa.string()), ("text", pa.string())])
RELATION_SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string()), ("text", pa.string()), ("inverse_text", pa.string())])
EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("relation", pa.int32())])
# Provenance (``seeder.data.provenance``), optional: the input file each triple came from, as an index
# into the manifest's ``edge_sources``, and its row there (a line, a table row or an RDF statement).
EDGE_SOURCE_SCHEMA = pa.schema([("source_file", pa.int32()), ("source_row", pa.int64())])
# Optional on nodes and relations: the IRI an RDF import took each from.
IRI_FIELD = pa.field("iri", pa.string())
QUERY_BASE_SCHEMA = pa.schema(
    [("id", pa.int64()), ("text", pa.string()), ("answers", pa.list_(pa.int64())), ("split", pa.string())]
)


# A node an update removed (``seeder.data.update``). Node ids are contiguous and stable across versions,
# so a removed node keeps its id as a row of this type, with this name and text and no edges or answers.
REMOVED_TYPE = "(removed)"


def default_inverse_text(text: str) -> str:
    """Text of the inverse of a relation when the source gives none."""
    return f"inverse of {text}"


# ---------------------------------------------------------------------------------------------------
# Validation


def _examples(values: np.ndarray | list, limit: int = 5) -> str:
    values = list(values[:limit])
    return ", ".join(str(v) for v in values)


def _check_columns(table: pa.Table, schema: pa.Schema, name: str) -> pa.Table:
    """Require the schema's columns with castable types; return the table cast to the schema's types."""
    for fld in schema:
        if fld.name not in table.column_names:
            raise DataError(
                f"{name}: missing column '{fld.name}' (have: {', '.join(table.column_names)}); "
                f"the table needs columns {', '.join(schema.names)}"
            )
        col = table.column(fld.name)
        if col.type != fld.type:
            try:
                col = col.cast(fld.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise DataError(f"{name}: column '{fld.name}' has type {col.type}, expected {fld.type} ({exc})") from None
            table = table.set_column(table.column_names.index(fld.name), fld.name, col)
    return table


def _with_optional(table: pa.Table, schema: pa.Schema, optional: pa.Schema, name: str) -> pa.Table:
    """The schema's columns, then those optional columns that the table has (all of them or none)."""
    present = [f.name for f in optional if f.name in table.column_names]
    if present and len(present) != len(optional):
        missing = [f.name for f in optional if f.name not in present]
        raise DataError(f"{name}: has {', '.join(present)} but not {', '.join(missing)}; give all of them or none")
    if present:
        schema = pa.schema([*schema, *optional])
    return _check_columns(table, schema, name).select(schema.names)


def _check_text(table: pa.Table, column: str, name: str, id_column: str = "id") -> None:
    col = table.column(column)
    bad = pc.or_(pc.is_null(col), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col.fill_null(""))), 0))
    n_bad = pc.sum(bad).as_py() or 0
    if n_bad:
        ids = table.column(id_column).filter(bad).to_numpy()
        raise DataError(
            f"{name}: {n_bad} rows with empty {column}, first ids: {_examples(ids)}; give every row a non-empty {column}"
        )


def validate_tables(
    nodes: pa.Table, relations: pa.Table, edges: pa.Table, queries: pa.Table
) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """Check the four tables against each other; return them cast to the store's schemas.

    Raises DataError naming the table, the offending ids (a count and the first few) and the fix.
    """
    nodes = _with_optional(nodes, NODE_SCHEMA, pa.schema([IRI_FIELD]), "nodes")
    relations = _with_optional(relations, RELATION_SCHEMA, pa.schema([IRI_FIELD]), "relations")
    edges = _with_optional(edges, EDGE_SCHEMA, EDGE_SOURCE_SCHEMA, "edges")
    queries = _check_columns(queries, QUERY_BASE_SCHEMA, "queries")

    n = nodes.num_rows
    node_ids = nodes.column("id").to_numpy()
    if n and not np.array_equal(node_ids, np.arange(n)):
        uniq, counts = np.unique(node_ids, return_counts=True)
        dup = uniq[counts > 1]
        if dup.size:
            raise DataError(f"nodes: {dup.size} duplicate node ids, first: {_examples(dup)}; every node id must be unique")
        raise DataError(
            "nodes: ids must be contiguous 0..N-1 in order (importers renumber; "
            f"first out-of-place ids: {_examples(node_ids[node_ids != np.arange(n)])})"
        )
    if n >= 2**31 - 1:
        raise DataError(f"nodes: {n} nodes exceed the int32 CSR limit of 2^31-1")
    _check_text(nodes, "text", "nodes")
    _check_text(nodes, "name", "nodes")

    r = relations.num_rows
    if r == 0:
        raise DataError("relations: the table is empty; a knowledge graph needs at least one relation")
    if not np.array_equal(relations.column("id").to_numpy(), np.arange(r)):
        raise DataError("relations: ids must be contiguous 0..R-1 in order")
    for column in ("name", "text", "inverse_text"):
        _check_text(relations, column, "relations")

    src = edges.column("src").to_numpy()
    dst = edges.column("dst").to_numpy()
    rel = edges.column("relation").to_numpy()
    for label, ids in (("src", src), ("dst", dst)):
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            rows = np.flatnonzero(bad)
            raise DataError(
                f"edges: {rows.size} edges whose {label} is not a node id (0..{n - 1}), first rows "
                f"{_examples(rows)} with {label} {_examples(ids[rows])}; add the missing nodes or drop those edges"
            )
    bad = (rel < 0) | (rel >= r)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise DataError(
            f"edges: {rows.size} edges with an unknown relation id (known: 0..{r - 1}), first rows "
            f"{_examples(rows)} with relation {_examples(rel[rows])}; add them to relations or drop those edges"
        )

    q_ids = queries.column("id").to_numpy()
    uniq, counts = np.unique(q_ids, return_counts=True)
    if (counts > 1).any():
        raise DataError(f"queries: duplicate query ids, first: {_examples(uniq[counts > 1])}; query ids must be unique")
    _check_text(queries, "text", "queries")
    lengths = pc.list_value_length(queries.column("answers")).fill_null(0).to_numpy()
    if (lengths == 0).any():
        raise DataError(
            f"queries: {(lengths == 0).sum()} queries without answers, first ids: "
            f"{_examples(q_ids[lengths == 0])}; every query needs at least one answer node id"
        )
    flat = pc.list_flatten(queries.column("answers")).to_numpy()
    bad = (flat < 0) | (flat >= n)
    if bad.any():
        owner = np.repeat(q_ids, lengths)[bad]
        raise DataError(
            f"queries: {bad.sum()} answer ids are not nodes of the graph, first (query id: answer id): "
            + ", ".join(f"{q}: {a}" for q, a in zip(owner[:5], flat[bad][:5]))
            + "; fix the answers or import the missing nodes"
        )
    splits = set(queries.column("split").unique().to_pylist())
    if not splits <= set(SPLITS):
        raise DataError(f"queries: unknown split values {sorted(splits - set(SPLITS))}; use train, val or test")
    return nodes, relations, edges, queries


# ---------------------------------------------------------------------------------------------------
# CSR adjacency


def edge_hashes(heads: np.ndarray, tails: np.ndarray, rels: np.ndarray) -> np.ndarray:
    """uint32 per CSR entry (node, neighbour, relation id): a fixed mix of the three (splitmix64's
    finaliser), the same in every version of a dataset and on every machine."""
    return mix_entry(heads.astype(np.uint64), tails.astype(np.uint64), rels.astype(np.uint64)).astype(np.uint32)


def mix_entry(head, tail, relation):
    """``edge_hashes`` on uint64 values, widened: numpy arrays here, one entry at a time in compiled
    code (``seeder.preprocessing.incremental`` compiles this same function)."""
    x = head * np.uint64(0x9E3779B97F4A7C15)
    x ^= tail * np.uint64(0xC2B2AE3D27D4EB4F)
    x ^= relation * np.uint64(0x165667B19E3779F9)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x >> np.uint64(32)


def build_csr(num_nodes: int, num_relations: int, src: np.ndarray, dst: np.ndarray, rel: np.ndarray):
    """CSR over both directions: (indptr int64 [N+1], neighbors int32 [2E], relations int32 [2E]); an
    out-edge keeps its relation r, an in-edge reads r + R.

    Each node's slice is ordered by ``edge_hashes`` (ties in input order), so the first ``cap`` entries
    of a slice are a uniform sample of it, which every capped reader takes (``paths.sampled_slices``).
    Unlike a stride over the slice, that sample moves only when an edge inside it is added or removed:
    a changed graph keeps its hubs' samples, and an update re-extracts few regions through a hub.
    """
    heads = np.concatenate([src, dst])
    tails = np.concatenate([dst, src]).astype(np.int32, copy=False)
    rels = np.concatenate([rel, rel + num_relations]).astype(np.int32, copy=False)
    order = np.argsort((heads.astype(np.uint64) << np.uint64(32)) | edge_hashes(heads, tails, rels), kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(heads, minlength=num_nodes), out=indptr[1:])
    return indptr, tails[order], rels[order]


# ---------------------------------------------------------------------------------------------------
# Writing and reading


def write_dataset(
    out: str | Path,
    nodes: pa.Table,
    relations: pa.Table,
    edges: pa.Table,
    queries: pa.Table,
    source: dict[str, Any] | None = None,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
    edge_sources: list[dict[str, Any]] | None = None,
) -> Path:
    """Validate and write a dataset directory atomically (a failed write leaves no complete dataset).

    ``extra``: further top-level manifest entries, such as an update's ``parent`` and ``change``.
    ``edge_sources``: the input files that the edges' ``source_file`` column indexes (required with that
    column), each ``{"file", "unit"}`` and, for a file an earlier version read, that version's ``dataset``.
    """
    own = {"kind", "schema_version", "created", "source", "counts", "query_attributes", "fingerprints", "edge_sources"}
    clash = set(extra or {}) & own
    if clash:
        raise ValueError(f"write_dataset: extra manifest entries {sorted(clash)} would replace the store's own")
    nodes, relations, edges, queries = validate_tables(nodes, relations, edges, queries)
    if "source_file" in edges.column_names:
        file_index = edges.column("source_file").to_numpy()
        bad = (file_index < 0) | (file_index >= len(edge_sources or []))
        if bad.any():
            raise ValueError(
                f"write_dataset: {int(bad.sum())} edges name a source_file outside the {len(edge_sources or [])} edge_sources"
            )
    out = Path(out)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        for name, table in (("nodes", nodes), ("relations", relations), ("edges", edges), ("queries", queries)):
            pq.write_table(table, tmp / f"{name}.parquet", row_group_size=1 << 20)
        adjacency = tmp / "adjacency"
        adjacency.mkdir()
        indptr, neighbors, rels = build_csr(
            nodes.num_rows,
            relations.num_rows,
            edges.column("src").to_numpy(),
            edges.column("dst").to_numpy(),
            edges.column("relation").to_numpy(),
        )
        for name, arr in (("indptr", indptr), ("neighbors", neighbors), ("relations", rels)):
            np.save(adjacency / f"{name}.npy", arr)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "kind": "seeder-dataset",
            "schema_version": SCHEMA_VERSION,
            "created": now(),
            "source": source or {},
            "counts": {
                "nodes": nodes.num_rows,
                "relations": relations.num_rows,
                "edges": edges.num_rows,
                "queries": queries.num_rows,
            },
            "query_attributes": [c for c in queries.column_names if c not in QUERY_BASE_SCHEMA.names],
            "fingerprints": {f: fingerprint_file(tmp / f) for f in files},
            **({"edge_sources": edge_sources} if "source_file" in edges.column_names else {}),
            **(extra or {}),
        }
        write_manifest(tmp, manifest)
    return out


@dataclass
class KnowledgeGraph:
    """A dataset opened for reading. Tables load lazily; the CSR is memory-mapped."""

    path: Path
    manifest: dict[str, Any]

    @property
    def num_nodes(self) -> int:
        return int(self.manifest["counts"]["nodes"])

    @property
    def num_relations(self) -> int:
        """R: base relations; the CSR uses ids 0..2R-1 (inverse relations are ``r + R``)."""
        return int(self.manifest["counts"]["relations"])

    @property
    def num_edges(self) -> int:
        return int(self.manifest["counts"]["edges"])

    @property
    def fingerprint(self) -> str:
        """One fingerprint of the whole dataset's content (for stage manifests downstream)."""
        return fingerprint_json(self.manifest["fingerprints"])

    @property
    def lineage(self) -> list[str]:
        """The fingerprints of the versions this one was updated from (``seeder.data.update``), parent
        first; empty for an imported dataset."""
        return list(self.manifest.get("lineage", []))

    def table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(self.path / f"{name}.parquet", columns=columns)

    @cached_property
    def nodes(self) -> pa.Table:
        return self.table("nodes")

    @cached_property
    def node_names(self) -> pa.ChunkedArray:
        """The ``name`` column alone: seeding and the prior's wording read it, and at millions of nodes
        the whole node table (texts included) is many times larger."""
        return self.nodes.column("name") if "nodes" in self.__dict__ else self.table("nodes", ["name"]).column("name")

    @cached_property
    def node_types(self) -> pa.ChunkedArray:
        """The ``type`` column alone: a masked question names its seed by its type."""
        return self.nodes.column("type") if "nodes" in self.__dict__ else self.table("nodes", ["type"]).column("type")

    @cached_property
    def relations(self) -> pa.Table:
        return self.table("relations")

    @cached_property
    def queries(self) -> pa.Table:
        return self.table("queries")

    def queries_of(self, split: str) -> pa.Table:
        return self.queries.filter(pc.equal(self.queries.column("split"), split))

    @cached_property
    def relation_texts(self) -> list[str]:
        """Texts of all 2R relation ids: the R base relations, then their inverses."""
        return self.relations.column("text").to_pylist() + self.relations.column("inverse_text").to_pylist()

    @cached_property
    def relation_names(self) -> list[str]:
        names = self.relations.column("name").to_pylist()
        return names + [f"{n} (inverse)" for n in names]

    @cached_property
    def indptr(self) -> np.ndarray:
        return np.load(self.path / "adjacency" / "indptr.npy", mmap_mode="r")

    @cached_property
    def neighbors(self) -> np.ndarray:
        return np.load(self.path / "adjacency" / "neighbors.npy", mmap_mode="r")

    @cached_property
    def edge_relations(self) -> np.ndarray:
        return np.load(self.path / "adjacency" / "relations.npy", mmap_mode="r")

    def query_rows(self, query_ids: np.ndarray) -> np.ndarray:
        """Row of each query id in queries.parquet (ids need not be sorted there); unknown ids are an error."""
        query_ids = np.asarray(query_ids, dtype=np.int64)
        ids = self.queries.column("id").to_numpy()
        order = np.argsort(ids)
        rows = order[np.minimum(np.searchsorted(ids[order], query_ids), len(ids) - 1)]
        missing = ids[rows] != query_ids
        if missing.any():
            raise DataError(f"{self.path}: query ids {query_ids[missing][:5].tolist()} are not in queries.parquet")
        return rows

    def query_attributes(self, query_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Each query attribute column (manifest ``query_attributes``, e.g. ``hop``), one value per id."""
        names = [c for c in self.manifest.get("query_attributes", []) if c in self.queries.column_names]
        if not names or len(query_ids) == 0:
            return {}
        rows = self.query_rows(query_ids)
        return {name: np.asarray(self.queries.column(name).to_numpy(zero_copy_only=False))[rows] for name in names}

    def degree(self) -> np.ndarray:
        """Degree over both directions."""
        return np.diff(self.indptr)

    def out_mask(self) -> np.ndarray:
        """True for CSR entries that are out-edges (relation id < R)."""
        return np.asarray(self.edge_relations) < self.num_relations

    def __reduce__(self):
        # Pickle as a path: a Ray task reopens the memory maps instead of shipping arrays.
        return (open_dataset, (str(self.path),))


def open_dataset(path: str | Path) -> KnowledgeGraph:
    """Open a complete dataset directory or URI (fetched first, ``seeder.system.storage``); a missing or
    partial one is a clear error."""
    path = fetch(path)
    if not path.is_dir():
        raise DataError(f"{path}: no such dataset directory; create one with `seeder import` or `seeder synth`")
    manifest = read_manifest(path)
    if manifest is None or manifest.get("kind") != "seeder-dataset":
        raise DataError(f"{path}: no dataset manifest (an interrupted import, or not a dataset); rerun the import into it")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise DataError(f"{path}: schema version {manifest.get('schema_version')} is not {SCHEMA_VERSION}; re-import the data")
    return KnowledgeGraph(path=path, manifest=manifest)


def summarize(kg: KnowledgeGraph) -> dict[str, Any]:
    """Counts for ``seeder info``: nodes per type, edges per relation, queries per split and attribute."""
    types = kg.table("nodes", ["type"]).column("type").value_counts().to_pylist()
    rel_counts = np.bincount(kg.table("edges", ["relation"]).column("relation").to_numpy(), minlength=kg.num_relations)
    queries = kg.queries
    by_split: dict[str, Any] = {}
    attrs = [c for c in kg.manifest.get("query_attributes", []) if c in queries.column_names]
    for split in SPLITS:
        sub = queries.filter(pc.equal(queries.column("split"), split))
        entry: dict[str, Any] = {"queries": sub.num_rows}
        for attr in attrs:
            col = sub.column(attr)
            # Only low-cardinality attributes (hop, qtype): an id column would print one line per query.
            if sub.num_rows and (pa.types.is_integer(col.type) or pa.types.is_string(col.type)) and len(col.unique()) <= 30:
                entry[attr] = {str(d["values"]): d["counts"] for d in col.value_counts().to_pylist()}
        by_split[split] = entry
    return {
        "path": str(kg.path),
        "nodes": kg.num_nodes,
        "relations": kg.num_relations,
        "relations_with_inverses": 2 * kg.num_relations,
        "edges": kg.num_edges,
        "node_types": {d["values"]: d["counts"] for d in types},
        "edges_per_relation": dict(zip(kg.relations.column("name").to_pylist(), rel_counts.tolist())),
        "queries": by_split,
        "source": kg.manifest.get("source", {}),
    }
