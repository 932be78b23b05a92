"""Graphs that change: a change set applied to a dataset, written as a new version of it.

A change set is the triples importer's files (``seeder.data.importers.triples``) with one more column,
``op``, whose values are ``add`` or ``remove``:

- triples (head, relation, tail, op): edges added and removed. An added triple may name a node or a
  relation the dataset does not have yet: it is created, a node with its key as name and text (or its
  row of the nodes file), a relation with the importer's text.
- nodes (``id`` or ``name``, text, optional type and, keyed by ``id``, name; op): ``add`` of a new key is
  a new node, ``add`` of an existing one edits its text (and its type or name, where the row gives
  them), ``remove`` removes the node and every edge that touches it.
- queries (text, answers, optional split, id and attributes; op): ``add`` is a new question, ``remove``
  names one of the dataset's questions by ``id`` or, without one, by its exact text.

Nodes are named as the dataset names them (the ``name`` column, which is the triples' key unless the
node file gave display names), relations by name. Ids stay stable, so that what was computed for a
version still indexes the next: existing nodes, relations and questions keep their ids, new ones get
ids after the current maximum. Node ids are contiguous, so a removed node keeps its id as a row of type
``REMOVED_TYPE`` with no edges and no answers. Questions left with no answer are dropped and counted.

Every inconsistency (an unknown op, removing what is not there, adding what is, a line listed twice, an
edge to a node the change removes) is a DataError naming the file, the lines and the fix, raised before
anything is written; the new version is written by ``write_dataset``, atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.data.importers import first_examples, lookup, progress
from seeder.data.importers.triples import (
    as_strings,
    read_nodes,
    read_query_table,
    read_triples,
    relation_table,
    resolve_queries,
    source_location,
)
from seeder.data.store import REMOVED_TYPE, KnowledgeGraph, open_dataset, write_dataset
from seeder.data.subgraphs import isin_sorted
from seeder.system.io import DataError, fingerprint_file, writes_output

OPS = ("add", "remove")
# What a change did, recorded as the new version's manifest ``change``.
COUNTS = (
    "triples_added",
    "triples_removed",
    "edges_removed_with_nodes",
    "nodes_added",
    "nodes_edited",
    "nodes_removed",
    "relations_added",
    "queries_added",
    "queries_removed",
    "queries_dropped",
    "answers_dropped",
)


@dataclass
class Change:
    """A dataset's four tables after a change set, what the change did (``counts``, recorded in the new
    version's manifest) and the fingerprints of the change files (``inputs``)."""

    nodes: pa.Table
    relations: pa.Table
    edges: pa.Table
    queries: pa.Table
    counts: dict[str, int]
    inputs: dict[str, str]
    edge_sources: list[dict[str, Any]]  # what the edges' ``source_file`` indexes (``seeder.data.provenance``)


def _is_add(ops: pa.Array, path: Path, line: np.ndarray) -> np.ndarray:
    """True for ``add`` rows, False for ``remove`` rows; any other op is an error naming the lines."""
    ops = pc.utf8_lower(ops.fill_null(""))
    bad = np.flatnonzero(~pc.is_in(ops, value_set=pa.array(OPS)).to_numpy(zero_copy_only=False))
    if bad.size:
        raise DataError(
            f"{path}: {bad.size} rows with an op that is not add or remove, first lines {first_examples(line[bad])} "
            f"({', '.join(repr(v) for v in ops.take(pa.array(bad[:5])).to_pylist())}); write add or remove in column op"
        )
    return pc.equal(ops, "add").to_numpy(zero_copy_only=False)


def _op_column(table: pa.Table, path: Path, line: np.ndarray) -> np.ndarray:
    if "op" not in table.column_names:
        raise DataError(
            f"{path}: no column 'op' (have: {', '.join(table.column_names)}); a change set marks every row "
            f"add or remove in a column op"
        )
    return _is_add(as_strings(table, "op", path), path, line)


def _quoted(values: pa.Array, rows: np.ndarray) -> str:
    return ", ".join(repr(v) for v in values.take(pa.array(rows[:5], pa.int64())).to_pylist())


def _triples_at(heads: pa.Array, rels: pa.Array, tails: pa.Array, rows: np.ndarray) -> str:
    take = pa.array(rows[:5], pa.int64())
    parts = zip(heads.take(take).to_pylist(), rels.take(take).to_pylist(), tails.take(take).to_pylist())
    return ", ".join(f"{h} {r} {t}" for h, r, t in parts)


def edge_keys(src: np.ndarray, rel: np.ndarray, dst: np.ndarray, num_nodes: int, num_relations: int) -> np.ndarray:
    """One int64 per (src, relation, dst), equal across versions that share ``num_nodes`` and
    ``num_relations`` (the larger version's counts)."""
    if num_nodes * num_nodes * max(num_relations, 1) >= 2**62:
        raise DataError(f"{num_nodes:,} nodes and {num_relations:,} relations: edge keys would overflow int64")
    return (src.astype(np.int64) * max(num_relations, 1) + rel.astype(np.int64)) * num_nodes + dst.astype(np.int64)


def _repeated(values: np.ndarray) -> np.ndarray:
    """True where a value already appeared in an earlier row."""
    first = np.zeros(len(values), dtype=bool)
    first[np.unique(values, return_index=True)[1]] = True
    return ~first


def _strings(count: int, value: str = "") -> pa.Array:
    return pa.array(np.full(count, value, dtype=object), pa.string())


class _Nodes:
    """The node table as a change set edits it: the parent's rows, edited in place or marked removed,
    then the new nodes. Names resolve to ids through ``resolve``; the columns stay Arrow arrays."""

    def __init__(self, parent: KnowledgeGraph):
        table = parent.nodes
        self.count = table.num_rows
        self.type, self.name, self.text = (table.column(c).combine_chunks() for c in ("type", "name", "text"))
        live = pc.not_equal(self.type, REMOVED_TYPE)
        shared = pc.value_counts(self.name.filter(live))
        self.ambiguous = shared.field("values").filter(pc.greater(shared.field("counts"), 1))
        # Removed nodes, and names several nodes share, resolve to no node.
        keyed = pc.and_(live, pc.invert(pc.is_in(self.name, value_set=self.ambiguous)))
        self.parent_keys = pc.if_else(keyed, self.name, pa.scalar(None, pa.string()))
        self.removed = np.zeros(self.count, dtype=bool)
        self.new_keys = self.new_type = self.new_name = self.new_text = _strings(0)

    def check_unambiguous(self, values: pa.Array, path: Path, line: np.ndarray, what: str) -> None:
        """A name that several of the parent's nodes share cannot be resolved: an error naming the lines."""
        rows = np.flatnonzero(pc.is_in(values, value_set=self.ambiguous).to_numpy(zero_copy_only=False))
        if rows.size:
            raise DataError(
                f"{path}: {rows.size} {what} name nodes whose name several nodes of the dataset share, first lines "
                f"{first_examples(line[rows])} ({_quoted(values, rows)}); a change set names nodes by name, so "
                f"re-import the graph with distinct node names"
            )

    def resolve(self, names: pa.Array) -> np.ndarray:
        """The id of each name (a node this change removes included), -1 where there is none."""
        return lookup(names, pa.concat_arrays([self.parent_keys, self.new_keys]))

    def removes(self, ids: np.ndarray) -> np.ndarray:
        """True for ids of nodes this change removes (False for -1 and new nodes)."""
        flags = np.concatenate([self.removed, np.zeros(len(self.new_keys) + 1, dtype=bool)])
        return flags[ids]

    def add(self, keys: pa.Array, types: pa.Array, names: pa.Array, texts: pa.Array) -> None:
        self.new_keys = pa.concat_arrays([self.new_keys, keys])
        self.new_type = pa.concat_arrays([self.new_type, types])
        self.new_name = pa.concat_arrays([self.new_name, names])
        self.new_text = pa.concat_arrays([self.new_text, texts])

    def edit(self, ids: np.ndarray, column: str, values: pa.Array) -> None:
        """Set ``column`` of parent nodes ``ids`` to ``values``; an empty value keeps the current one."""
        current = getattr(self, column)
        values = pc.if_else(pc.equal(values, ""), current.take(pa.array(ids)), values)
        mask = np.zeros(self.count, dtype=bool)
        mask[ids] = True
        setattr(self, column, pc.replace_with_mask(current, pa.array(mask), values.take(pa.array(np.argsort(ids)))))

    @property
    def keys(self) -> pa.Array:
        """The new version's node keys by id, for its answers: removed nodes have none."""
        parent_keys = pc.if_else(pa.array(self.removed), pa.scalar(None, pa.string()), self.parent_keys)
        return pa.concat_arrays([parent_keys, self.new_keys])

    def table(self) -> pa.Table:
        removed = pa.array(self.removed)
        columns = {
            column: pa.concat_arrays([pc.if_else(removed, REMOVED_TYPE, getattr(self, column)), getattr(self, f"new_{column}")])
            for column in ("type", "name", "text")
        }
        return pa.table({"id": pa.array(np.arange(self.count + len(self.new_keys), dtype=np.int64)), **columns})


def _change_nodes(nodes: _Nodes, parent: KnowledgeGraph, path: Path, counts: dict[str, int]) -> None:
    """Apply a nodes file: ``add`` of a new key is a new node, of an existing one an edit; ``remove`` marks it."""
    rows = read_nodes(path)
    line = np.arange(rows.table.num_rows) + 2
    add = _op_column(rows.table, path, line)
    nodes.check_unambiguous(rows.keys, path, line, "rows")
    hit = nodes.resolve(rows.keys)
    missing = np.flatnonzero(~add & (hit < 0))
    if missing.size:
        raise DataError(
            f"{path}: {missing.size} nodes to remove are not nodes of {parent.path}, first lines "
            f"{first_examples(line[missing])} ({_quoted(rows.keys, missing)}); check their names or drop those rows"
        )
    rows.require_text(add)
    types = rows.types if rows.types is not None else _strings(len(add))
    names = rows.names if rows.names is not None else _strings(len(add))
    reserved = np.flatnonzero(add & pc.equal(types, REMOVED_TYPE).to_numpy(zero_copy_only=False))
    if reserved.size:
        raise DataError(
            f"{path}: {reserved.size} nodes of type {REMOVED_TYPE!r}, first lines {first_examples(line[reserved])}; "
            f"that type marks removed nodes, so give them another type (or op remove to remove them)"
        )
    edit = add & (hit >= 0)
    for column, values in (("type", types), ("name", names), ("text", rows.text)):
        nodes.edit(hit[edit], column, values.filter(pa.array(edit)))
    nodes.removed[hit[~add]] = True
    new = pa.array(add & (hit < 0))
    keys = rows.keys.filter(new)
    nodes.add(
        keys,
        pc.if_else(pc.equal(types.filter(new), ""), "entity", types.filter(new)),
        pc.if_else(pc.equal(names.filter(new), ""), keys, names.filter(new)),
        rows.text.filter(new),
    )
    counts.update(nodes_edited=int(edit.sum()), nodes_removed=int((~add).sum()))


def _change_edges(
    nodes: _Nodes,
    parent: KnowledgeGraph,
    path: Path | None,
    read: dict[str, Any],
    counts: dict[str, int],
) -> tuple[pa.Table, pa.Table, list[dict[str, Any]]]:
    """The relations and edges after a triples file (``read``: ``read_triples``' column options) and the
    nodes' removal (a removed node's edges go with it), and the edges' ``edge_sources``."""
    relations = parent.relations
    edges = parent.table("edges")
    p_src, p_dst = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    p_rel = edges.column("relation").to_numpy()
    # Provenance: the parent's triples keep their source, read by the version that read it; a parent
    # without one names its own edges table's rows.
    if "source_file" in edges.column_names:
        p_file, p_row = edges.column("source_file").to_numpy(), edges.column("source_row").to_numpy()
        sources = [{**entry, "dataset": entry.get("dataset") or parent.fingerprint} for entry in parent.manifest["edge_sources"]]
    else:
        p_file, p_row = np.zeros(len(p_src), dtype=np.int32), np.arange(len(p_src), dtype=np.int64)
        sources = [{"file": "edges.parquet", "unit": "row", "dataset": parent.fingerprint}]
    c_file = c_row = np.zeros(0, dtype=np.int64)
    with_nodes = nodes.removes(p_src) | nodes.removes(p_dst)
    explicit = np.zeros(len(p_src), dtype=bool)  # parent edges the triples file removes
    src = dst = rel = np.zeros(0, dtype=np.int64)
    if path is not None:
        (heads, rels, tails, ops), first_line = read_triples(path, **read, extra=("op",))
        line = np.arange(len(heads)) + first_line
        add = _is_add(ops, path, line)
        for values in (heads, tails):
            nodes.check_unambiguous(values, path, line, "triples")
        src, dst = nodes.resolve(heads), nodes.resolve(tails)
        gone = np.flatnonzero(add & (nodes.removes(src) | nodes.removes(dst)))
        if gone.size:
            raise DataError(
                f"{path}: {gone.size} added triples name a node this change removes, first lines "
                f"{first_examples(line[gone])} ({_triples_at(heads, rels, tails, gone)}); drop those triples or keep the node"
            )
        # Nodes named only by added triples get their key as name and text, as the importer gives them.
        unnamed = pc.unique(pa.concat_arrays([heads.filter(pa.array(add & (src < 0))), tails.filter(pa.array(add & (dst < 0)))]))
        nodes.add(unnamed, _strings(len(unnamed), "entity"), unnamed, unnamed)
        src, dst = nodes.resolve(heads), nodes.resolve(tails)
        rel = lookup(rels, relations.column("name").combine_chunks())
        fresh = pc.unique(rels.filter(pa.array(add & (rel < 0))))
        fresh = relation_table(fresh.take(pc.array_sort_indices(fresh)), first_id=relations.num_rows)
        relations = pa.concat_tables([relations.cast(fresh.schema), fresh])
        rel = lookup(rels, relations.column("name").combine_chunks())

        # One key per (src, relation, dst), the parent's edges and the change's rows alike; a row naming
        # an unknown node or relation (only a removal can) gets a negative key of its own, an edge of none.
        width_n, width_r = nodes.count + len(nodes.new_keys), relations.num_rows
        p_code = edge_keys(p_src, p_rel, p_dst, width_n, width_r)
        unknown = (src < 0) | (rel < 0) | (dst < 0)
        c_code = np.where(unknown, -1 - np.arange(len(src)), edge_keys(src, rel, dst, width_n, width_r))
        present = isin_sorted(c_code, p_code)
        for rows, problem, fix in (
            (~add & ~present, f"triples to remove are not edges of {parent.path}", "check their names or drop those rows"),
            (_repeated(c_code), "triples are listed twice", "list each change once"),
            (add & present, f"added triples are already edges of {parent.path}", "drop those rows"),
        ):
            rows = np.flatnonzero(rows)
            if rows.size:
                raise DataError(
                    f"{path}: {rows.size} {problem}, first lines {first_examples(line[rows])} "
                    f"({_triples_at(heads, rels, tails, rows)}); {fix}"
                )
        explicit = isin_sorted(p_code, c_code[~add])
        src, dst, rel = src[add], dst[add], rel[add]
        entry, offset = source_location(path, first_line)
        c_file, c_row = np.full(len(src), len(sources)), np.flatnonzero(add) + offset
        sources.append(entry)
        counts.update(triples_added=int(add.sum()), triples_removed=int((~add).sum()), relations_added=fresh.num_rows)
    keep = ~(with_nodes | explicit)
    counts["edges_removed_with_nodes"] = int((with_nodes & ~explicit).sum())
    edges = pa.table(
        {
            "src": pa.array(np.concatenate([p_src[keep], src]), pa.int64()),
            "dst": pa.array(np.concatenate([p_dst[keep], dst]), pa.int64()),
            "relation": pa.array(np.concatenate([p_rel[keep], rel]), pa.int32()),
            "source_file": pa.array(np.concatenate([p_file[keep], c_file]), pa.int32()),
            "source_row": pa.array(np.concatenate([p_row[keep], c_row]), pa.int64()),
        }
    )
    return relations, edges, sources


def apply_changes(
    parent: KnowledgeGraph,
    triples: str | Path | None = None,
    nodes: str | Path | None = None,
    queries: str | Path | None = None,
    head_col: str = "head",
    relation_col: str = "relation",
    tail_col: str = "tail",
    no_header: bool = False,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> Change:
    """The parent's tables with a change set applied (any of a triples, a nodes and a queries file).

    Reads the files as the triples importer does (``head_col``..``no_header`` for the triples file,
    ``val_fraction`` and ``test_fraction`` for added questions without a split) and writes nothing.
    """
    if triples is None and nodes is None and queries is None:
        raise DataError("an update needs a change set: give a triples, nodes or queries file (each with a column op)")
    paths = [Path(p) if p is not None else None for p in (triples, nodes, queries)]
    counts = dict.fromkeys(COUNTS, 0)
    state = _Nodes(parent)
    if paths[1] is not None:
        _change_nodes(state, parent, paths[1], counts)
    read = {"head_col": head_col, "relation_col": relation_col, "tail_col": tail_col, "no_header": no_header}
    relations, edges, sources = _change_edges(state, parent, paths[0], read, counts)
    counts["nodes_added"] = len(state.new_keys)
    questions = _change_queries(parent, paths[2], state, val_fraction, test_fraction, counts)
    inputs = {p.name: fingerprint_file(p) for p in paths if p is not None}
    return Change(state.table(), relations, edges, questions, counts, inputs, sources)


def _change_queries(
    parent: KnowledgeGraph,
    path: Path | None,
    nodes: _Nodes,
    val_fraction: float,
    test_fraction: float,
    counts: dict[str, int],
) -> pa.Table:
    """The parent's questions less those a queries file removes and those left without an answer, then
    the ones it adds (answers resolved against the new version's nodes)."""
    table = parent.queries
    ids = table.column("id").to_numpy()
    keep = np.ones(table.num_rows, dtype=bool)
    added = None
    if path is not None:
        change = read_query_table(path)
        line = np.arange(change.num_rows) + 2
        add = _op_column(change, path, line)
        text = _strings(change.num_rows)
        if "text" in change.column_names:
            text = pc.utf8_trim_whitespace(change.column("text").combine_chunks().cast(pa.string())).fill_null("")
        given = pa.nulls(change.num_rows, pa.int64())
        if "id" in change.column_names:
            try:
                given = change.column("id").combine_chunks().cast(pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise DataError(f"{path}: column 'id' must hold integer query ids") from None
        has_id = pc.is_valid(given).to_numpy(zero_copy_only=False)
        given_ids = given.fill_null(-1).to_numpy()

        # Questions to remove: by id where the row gives one, otherwise by their exact text.
        by_id = ~add & has_id
        by_text = ~add & ~has_id
        nameless = np.flatnonzero(by_text & (pc.utf8_length(text).to_numpy(zero_copy_only=False) == 0))
        if nameless.size:
            raise DataError(
                f"{path}: {nameless.size} questions to remove have neither id nor text, first lines "
                f"{first_examples(line[nameless])}; give the id or the exact text of the question to remove"
            )
        row = np.where(by_id, lookup(given, pa.array(ids)), lookup(text, table.column("text").combine_chunks()))
        missing = np.flatnonzero(~add & (row < 0))
        if missing.size:
            what = np.where(by_id, given_ids.astype(str), text.to_numpy(zero_copy_only=False))
            raise DataError(
                f"{path}: {missing.size} questions to remove are not questions of {parent.path}, first lines "
                f"{first_examples(line[missing])} ({', '.join(repr(v) for v in what[missing[:5]])}); check their id or text"
            )
        shared = pc.value_counts(table.column("text"))
        repeated = shared.field("values").filter(pc.greater(shared.field("counts"), 1))
        unclear = np.flatnonzero(by_text & pc.is_in(text, value_set=repeated).to_numpy(zero_copy_only=False))
        if unclear.size:
            raise DataError(
                f"{path}: {unclear.size} questions to remove have a text that several questions share, first lines "
                f"{first_examples(line[unclear])} ({_quoted(text, unclear)}); name them by id"
            )
        target = row[~add]
        twice = line[~add][_repeated(target)]
        if twice.size:
            raise DataError(
                f"{path}: {twice.size} questions are removed twice, first lines {first_examples(twice)}; remove each once"
            )
        keep[target] = False
        counts["queries_removed"] = int(target.size)

        if add.any():
            new_ids, own = given_ids[add], has_id[add]
            reused = own & np.isin(new_ids, ids)
            reused[own] |= _repeated(new_ids[own])
            taken = np.flatnonzero(reused)
            if taken.size:
                raise DataError(
                    f"{path}: {taken.size} added questions have ids already taken (by the dataset's questions or an "
                    f"earlier row), first lines {first_examples(line[add][taken])} (ids {first_examples(new_ids[taken])}); "
                    f"leave id empty to get a new one"
                )
            top = max(int(ids.max(initial=-1)), int(new_ids[own].max(initial=-1)))
            new_ids[~own] = top + 1 + np.arange(int((~own).sum()))
            rows = change.filter(pa.array(add)).drop_columns([c for c in ("op", "id") if c in change.column_names])
            added = resolve_queries(rows, path, nodes.keys, val_fraction, test_fraction, line=line[add])
            added = added.set_column(0, "id", pa.array(new_ids, pa.int64()))
            counts["queries_added"] = added.num_rows

    # Answers that are removed nodes go; a question left without one is dropped, as the importers do.
    table = table.filter(pa.array(keep))
    answers = table.column("answers").combine_chunks()
    flat = pc.list_flatten(answers).to_numpy()
    lengths = pc.list_value_length(answers).fill_null(0).to_numpy()
    stays = ~nodes.removed[flat]
    left = np.bincount(np.repeat(np.arange(table.num_rows), lengths)[stays], minlength=table.num_rows)
    offsets = np.zeros(table.num_rows + 1, dtype=np.int32)
    np.cumsum(left, out=offsets[1:])
    table = table.set_column(
        table.column_names.index("answers"),
        "answers",
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat[stays], pa.int64())),
    )
    table = table.filter(pa.array(left > 0))
    counts.update(answers_dropped=int((~stays).sum()), queries_dropped=int((left == 0).sum()))
    if added is None:
        return table
    try:
        return pa.concat_tables([table, added], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"{path}: its columns do not fit the dataset's questions ({exc}); give attribute columns the types they have in {parent.path}"
        ) from None


@writes_output
def update_dataset(
    parent_path: str | Path,
    out: str | Path,
    triples_path: str | Path | None = None,
    nodes_path: str | Path | None = None,
    queries_path: str | Path | None = None,
    head_col: str = "head",
    relation_col: str = "relation",
    tail_col: str = "tail",
    no_header: bool = False,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write the dataset at ``parent_path`` with a change set applied as a new dataset at ``out``.

    The parent is left as it is. The new manifest records ``parent`` (its fingerprint and path) and
    ``change`` (the counts of ``apply_changes``); those counts are returned.
    """
    parent = open_dataset(parent_path)
    if Path(out).resolve() == parent.path.resolve():
        raise DataError(
            f"{out}: is the dataset being updated; write the new version to another --out (the parent stays as it is)"
        )
    progress(f"update: applying changes to {parent.path}")
    change = apply_changes(
        parent,
        triples=triples_path,
        nodes=nodes_path,
        queries=queries_path,
        head_col=head_col,
        relation_col=relation_col,
        tail_col=tail_col,
        no_header=no_header,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
    )
    c = change.counts
    progress(
        f"update: triples +{c['triples_added']:,} -{c['triples_removed']:,} ({c['edges_removed_with_nodes']:,} more edges "
        f"went with removed nodes); nodes +{c['nodes_added']:,} ~{c['nodes_edited']:,} -{c['nodes_removed']:,}; "
        f"relations +{c['relations_added']}; queries +{c['queries_added']:,} -{c['queries_removed']:,}"
    )
    if c["queries_dropped"] or c["answers_dropped"]:
        progress(
            f"update: {c['answers_dropped']:,} answers were removed nodes; {c['queries_dropped']:,} queries left "
            f"without answers dropped"
        )
    location = str(parent_path) if "://" in str(parent_path) else str(parent.path.resolve())
    write_dataset(
        out,
        change.nodes,
        change.relations,
        change.edges,
        change.queries,
        source={"format": "update", "inputs": change.inputs},
        overwrite=overwrite,
        edge_sources=change.edge_sources,
        extra={
            "parent": {"fingerprint": parent.fingerprint, "path": location},
            "lineage": [parent.fingerprint, *parent.lineage],
            "change": c,
        },
    )
    progress(f"update: wrote {out}")
    return c
