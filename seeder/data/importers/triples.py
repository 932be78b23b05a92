"""Generic triples: a TSV/CSV/Parquet file of (head, relation, tail) plus optional node texts and queries.

- Triples: columns named by ``head_col``/``relation_col``/``tail_col`` (default ``head,relation,tail``),
  or any file with exactly three columns (taken in that order).
- Node file (optional): ``id`` (or ``name``): the string used in the triples; ``text``; optional ``type``
  and, when the key is ``id``, an optional ``name`` shown to readers. Nodes without a row get their key as
  name and text.
- Queries file (optional): ``text``, ``answers`` (node keys separated by ``|``), optional ``split``
  (train/val/test; otherwise a stable hash of the text decides) and optional ``id``. Any other column is
  kept as a query attribute.

Ids (heads, relations, tails, node-file keys, answers) are strings exactly as written in a TSV or CSV,
never type-guessed: ``007`` and ``7`` are two nodes, and a date- or number-looking id stays text.
Duplicate triples are dropped and counted (``duplicate_triples`` in the manifest's source). Answers that
are not nodes of the graph are errors naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from seeder.data.importers import check_utf8, first_examples, hash_split, lookup, progress, require_file
from seeder.data.store import SPLITS, default_inverse_text, write_dataset
from seeder.system.io import DataError, fingerprint_file, writes_output


def _no_rows(path: Path, what: str) -> DataError:
    return DataError(f"{path}: {what}; a file needs at least one row of data")


def read_table(path: str | Path, header: bool = True, string_columns: tuple[str, ...] | None = None) -> pa.Table:
    """A TSV, CSV or Parquet file as an Arrow table (line numbers: row + 2 with a header).

    Text files: the columns in ``string_columns`` (all of them when None) are read as strings exactly as
    written, never type-guessed: ids ``007`` and ``7``, ``01`` and ``1`` stay distinct, and a date, float
    or boolean looking id stays text. A BOM is dropped, and rows with the wrong number of columns are an
    error naming the file and the row.
    """
    path = require_file(path)
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            table = pq.read_table(path)
        except pa.ArrowInvalid as exc:
            raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
        if table.num_rows == 0:
            raise _no_rows(path, "a Parquet file with no rows")
        return table
    check_utf8(path)
    kind = "CSV" if suffix == ".csv" else "TSV"
    delimiter = "," if kind == "CSV" else "\t"
    bad_rows: list = []

    def invalid_row(row) -> str:
        bad_rows.append(row)  # called for malformed rows only, not per row
        return "skip"

    def options(use_threads: bool = True):
        return (
            pacsv.ReadOptions(autogenerate_column_names=not header, use_threads=use_threads),
            pacsv.ParseOptions(delimiter=delimiter, quote_char='"' if kind == "CSV" else False, invalid_row_handler=invalid_row),
        )

    try:
        # Column names first (one block), to ask for their types: pyarrow has no "every column is a string".
        reader = pacsv.open_csv(path, *options())
        names = reader.schema.names
        reader.close()
        wanted = names if string_columns is None else [n for n in names if n in string_columns]
        convert = pacsv.ConvertOptions(
            column_types={n: pa.string() for n in wanted},
            strings_can_be_null=False,
            auto_dict_encode=False,
            include_missing_columns=False,
        )
        bad_rows.clear()
        table = pacsv.read_csv(path, *options(), convert_options=convert)
        if bad_rows:
            # Row numbers are known only to a single-threaded read: redo it on this error path alone.
            count = len(bad_rows)
            bad_rows.clear()
            pacsv.read_csv(path, *options(use_threads=False), convert_options=convert)
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" in str(exc):
            expected = "a header line and at least one row" if header else "at least one row"
            raise DataError(f"{path}: the file is empty; expected {expected}") from None
        raise DataError(f"{path}: cannot parse as {kind} ({exc})") from None
    if bad_rows:
        first = bad_rows[0]
        where = f"line {first.number}" if first.number is not None else "a line"
        raise DataError(
            f"{path}: {count} rows do not have {first.expected_columns} columns"
            f"{' like the header' if header else ' like the first row'}, first {where} ({first.actual_columns} "
            f"columns: {first.text[:200]!r}); every row needs one value per column, "
            f"{'comma' if kind == 'CSV' else 'tab'}-separated"
        )
    if table.num_rows == 0:
        raise _no_rows(path, "header only (a header line and no rows)")
    return table


def as_strings(table: pa.Table, column: str, path: Path) -> pa.Array:
    """Column ``column`` as trimmed strings: ids are compared as text, so integer ids become their digits."""
    col = table.column(column).combine_chunks()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type)):
        raise DataError(f"{path}: column '{column}' has type {col.type}; expected strings or integer ids")
    return pc.utf8_trim_whitespace(col.cast(pa.string()))


def empty_rows(values: pa.Array) -> np.ndarray:
    """Rows whose value is null or the empty string."""
    return np.flatnonzero(pc.or_(pc.is_null(values), pc.equal(pc.utf8_length(values), 0)).to_numpy(zero_copy_only=False))


def read_triples(
    path: Path,
    head_col: str = "head",
    relation_col: str = "relation",
    tail_col: str = "tail",
    no_header: bool = False,
    extra: tuple[str, ...] = (),
) -> tuple[list[pa.Array], int]:
    """The head, relation and tail columns of a triples file as trimmed strings, then the ``extra``
    columns (a change set's ``op``), and the line number of the first row (for error messages).

    Columns are found by name, or taken in order from a file with exactly that many columns (always so
    in a file without a header). An empty head, relation or tail is an error naming the lines.
    """
    table = read_table(path, header=not no_header)
    cols = [head_col, relation_col, tail_col, *extra]
    labels = ["head", "relation", "tail", *extra]
    if no_header and table.num_columns != len(cols):
        raise DataError(
            f"{path}: {table.num_columns} columns, expected {len(cols)} ({', '.join(labels)}) in a file without a header"
        )
    if not set(cols) <= set(table.column_names):
        if table.num_columns != len(cols):
            exactly = "exactly three columns" if not extra else f"exactly {len(cols)} columns ({', '.join(labels)})"
            raise DataError(
                f"{path}: no columns {', '.join(cols)} (have: {', '.join(table.column_names)}); name them with "
                f"--head-col/--relation-col/--tail-col or give a file with {exactly}"
            )
        cols = table.column_names
    first_line = 1 if no_header else 2
    columns = [as_strings(table, c, path) for c in cols]
    for label, values in zip(("head", "relation", "tail"), columns):
        empty = empty_rows(values)
        if empty.size:
            raise DataError(
                f"{path}: {empty.size} rows with an empty {label}, first lines {first_examples(empty + first_line)}; "
                f"fill or remove them"
            )
    return columns, first_line


@dataclass
class NodeRows:
    """A node file's rows (row ``i`` is line ``i + 2``): each node's key, the string the triples use; its
    trimmed text; and its display name and type where the file has those columns ("" where a row leaves
    them empty)."""

    path: Path
    table: pa.Table
    keys: pa.Array
    text: pa.Array
    names: pa.Array | None
    types: pa.Array | None

    def require_text(self, rows: np.ndarray | None = None) -> None:
        """Raise DataError naming the first lines with an empty text (among the boolean mask ``rows``, or all)."""
        empty = empty_rows(self.text)
        if rows is not None:
            empty = empty[rows[empty]]
        if empty.size:
            raise DataError(
                f"{self.path}: {empty.size} nodes with empty text, first lines {first_examples(empty + 2)}; "
                f"give every node a text or drop its row"
            )


def read_nodes(path: Path) -> NodeRows:
    """A node file: ``id`` (or ``name``) and ``text``, optional ``type`` and, keyed by ``id``, ``name``.

    Every column is read as a string. A missing column, an empty key or a key listed twice is an error
    naming the lines; empty texts are checked by ``NodeRows.require_text``.
    """
    table = read_table(path)  # every column a string: ids, names, types and texts
    key_col = "id" if "id" in table.column_names else "name" if "name" in table.column_names else None
    if key_col is None or "text" not in table.column_names:
        raise DataError(f"{path}: needs columns id (or name) and text, optional type (have: {', '.join(table.column_names)})")
    keys = as_strings(table, key_col, path)
    empty = empty_rows(keys)
    if empty.size:
        raise DataError(
            f"{path}: {empty.size} rows with an empty {key_col}, first lines {first_examples(empty + 2)}; "
            f"give every node its {key_col} or drop its row"
        )
    order = pc.array_sort_indices(keys)
    sorted_keys = keys.take(order).to_numpy(zero_copy_only=False)
    dup = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if dup.size:
        rows = order.to_numpy()[dup + 1] + 2
        raise DataError(
            f"{path}: {dup.size} duplicate node ids, first {first_examples(sorted_keys[dup])} "
            f"(lines {first_examples(rows)}); every node id must appear once"
        )
    text = pc.utf8_trim_whitespace(table.column("text").combine_chunks().cast(pa.string())).fill_null("")
    names = as_strings(table, "name", path).fill_null("") if key_col == "id" and "name" in table.column_names else None
    types = as_strings(table, "type", path).fill_null("") if "type" in table.column_names else None
    return NodeRows(path=path, table=table, keys=keys, text=text, names=names, types=types)


def relation_table(names: pa.Array, first_id: int = 0) -> pa.Table:
    """Relations ``names`` with ids from ``first_id``: the text is the name with underscores read as
    spaces, the inverse text the store's default."""
    text = pc.utf8_trim_whitespace(pc.replace_substring(names, "_", " "))
    # A relation named only of underscores ("_") would get an empty text: it reads as its name instead.
    text = pc.if_else(pc.equal(pc.utf8_length(text), 0), names, text)
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + len(names), dtype=np.int32)),
            "name": names,
            "text": text,
            "inverse_text": pa.array([default_inverse_text(t) for t in text.to_pylist()], pa.string()),
        }
    )


@writes_output
def import_triples(
    triples: str | Path,
    out: str | Path,
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
    """Import generic triples (and optional node texts and queries) into dataset directory ``out``."""
    triples = Path(triples)
    progress(f"triples: reading {triples}")
    (heads, rels, tails), first_line = read_triples(triples, head_col, relation_col, tail_col, no_header)
    edge_source, row_offset = source_location(triples, first_line)

    inputs = {triples.name: fingerprint_file(triples)}
    keys = pc.unique(pa.concat_arrays([heads, tails]))
    types = pa.array(np.full(len(keys), "entity", dtype=object), pa.string())
    names, texts = keys, keys
    if nodes_path is not None:
        nodes_path = Path(nodes_path)
        node_rows = read_nodes(nodes_path)
        node_rows.require_text()
        inputs[nodes_path.name] = fingerprint_file(nodes_path)
        # Nodes listed in the node file but in no triple are kept (isolated nodes are still answers).
        keys = pc.unique(pa.concat_arrays([node_rows.keys, keys]))
        row = lookup(keys, node_rows.keys)
        has = row >= 0
        safe = pa.array(np.where(has, row, 0))
        key_values = keys.to_numpy(zero_copy_only=False)
        texts = pa.array(np.where(has, node_rows.text.take(safe).to_numpy(zero_copy_only=False), key_values), pa.string())
        names = keys
        if node_rows.names is not None:
            chosen = node_rows.names.take(safe).to_numpy(zero_copy_only=False)
            names = pa.array(np.where(has & (chosen != ""), chosen, key_values), pa.string())
        if node_rows.types is not None:
            chosen = node_rows.types.take(safe).to_numpy(zero_copy_only=False)
            types = pa.array(np.where(has & (chosen != ""), chosen, "entity"), pa.string())

    rel_names = pc.unique(rels)
    relations = relation_table(rel_names.take(pc.array_sort_indices(rel_names)))
    rel_names = relations.column("name").combine_chunks()
    nodes = pa.table({"id": pa.array(np.arange(len(keys), dtype=np.int64)), "type": types, "name": names, "text": texts})
    src, dst, rel = lookup(heads, keys), lookup(tails, keys), lookup(rels, rel_names).astype(np.int32)
    # A triple listed twice is one fact (as in the MetaQA importer): keep its first row, count the rest.
    _, first = np.unique(np.stack([src, rel.astype(np.int64), dst], axis=1), axis=0, return_index=True)
    first.sort()
    duplicates = len(src) - first.size
    edges = pa.table(
        {
            "src": src[first],
            "dst": dst[first],
            "relation": rel[first],
            "source_file": np.zeros(first.size, dtype=np.int32),
            "source_row": first + row_offset,
        }
    )
    progress(
        f"triples: {nodes.num_rows:,} nodes, {edges.num_rows:,} edges, {relations.num_rows} relations; "
        f"{duplicates:,} duplicate triples dropped"
    )

    if queries_path is not None:
        queries_path = Path(queries_path)
        queries = read_queries(queries_path, keys, val_fraction, test_fraction)
        inputs[queries_path.name] = fingerprint_file(queries_path)
    else:
        queries = empty_queries()
    source = {"format": "triples", "triples": str(triples), "inputs": inputs, "duplicate_triples": int(duplicates)}
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite, edge_sources=[edge_source])
    progress(f"triples: wrote {out}: {queries.num_rows:,} queries")
    return source


def source_location(path: Path, first_line: int) -> tuple[dict[str, Any], int]:
    """An ``edge_sources`` entry (``seeder.data.provenance``) for a triples file, and what to add to a
    row's index to get its number there: a Parquet file's triples are known by their row (from 0), a
    text file's by their line."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return {"file": path.name, "unit": "row"}, 0
    return {"file": path.name, "unit": "line"}, first_line


def empty_queries() -> pa.Table:
    """A queries table with the store's columns and no rows (a graph imported without questions)."""
    return pa.table(
        {
            "id": pa.array([], pa.int64()),
            "text": pa.array([], pa.string()),
            "answers": pa.array([], pa.list_(pa.int64())),
            "split": pa.array([], pa.string()),
        }
    )


def read_queries(path: Path, keys: pa.Array, val_fraction: float, test_fraction: float) -> pa.Table:
    """Queries with answers resolved to node ids; unknown answers are errors naming the line."""
    return resolve_queries(read_query_table(path), path, keys, val_fraction, test_fraction)


def read_query_table(path: Path) -> pa.Table:
    """A queries file as read: answers are node ids, so strings like the triples' ids (as are text and
    split); other columns keep their types (they become query attributes)."""
    return read_table(path, string_columns=("text", "answers", "split"))


def resolve_queries(
    table: pa.Table,
    path: Path,
    keys: pa.Array,
    val_fraction: float,
    test_fraction: float,
    line: np.ndarray | None = None,
) -> pa.Table:
    """The store's queries from the rows of a queries file: answers resolved to node ids (the position of
    their key in ``keys``), a split from the file or a stable hash of the text, and the other columns
    kept as attributes. ``line`` gives each row's line in ``path`` (row + 2 by default)."""
    for col in ("text", "answers"):
        if col not in table.column_names:
            raise DataError(
                f"{path}: missing column '{col}' (have: {', '.join(table.column_names)}); a queries file needs "
                f"text and answers (node ids separated by |), optional split and id"
            )
    if line is None:
        line = np.arange(table.num_rows) + 2
    text = pc.utf8_trim_whitespace(table.column("text").combine_chunks().cast(pa.string()))
    empty = empty_rows(text)
    if empty.size:
        raise DataError(f"{path}: {empty.size} queries with empty text, first lines {first_examples(line[empty])}")
    answer_field = as_strings(table, "answers", path).fill_null("")
    answer_lists = pc.split_pattern(answer_field, "|")
    flat = pc.utf8_trim_whitespace(pc.list_flatten(answer_lists))
    owner = np.repeat(np.arange(table.num_rows), pc.list_value_length(answer_lists).to_numpy())
    nonempty = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    flat, owner = flat.filter(pa.array(nonempty)), owner[nonempty]
    no_answer = np.flatnonzero(np.bincount(owner, minlength=table.num_rows) == 0)
    if no_answer.size:
        raise DataError(
            f"{path}: {no_answer.size} queries without answers, first lines {first_examples(line[no_answer])}; "
            f"list their answer node ids separated by |"
        )
    ids = lookup(flat, keys)
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        raise DataError(
            f"{path}: {bad.size} answers are not nodes of the graph, first at lines "
            f"{first_examples(line[owner[bad]])} ({', '.join(repr(v) for v in flat.take(pa.array(bad[:5])).to_pylist())}); "
            f"fix the answers or add those nodes"
        )
    pairs = np.unique(np.stack([owner, ids], axis=1), axis=0)
    offsets = np.zeros(table.num_rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(pairs[:, 0], minlength=table.num_rows), out=offsets[1:])
    answers = pa.ListArray.from_arrays(pa.array(offsets), pa.array(pairs[:, 1], pa.int64()))

    if "split" in table.column_names:
        split = as_strings(table, "split", path).fill_null("")
        bad = np.flatnonzero(~pc.is_in(split, value_set=pa.array(SPLITS)).to_numpy(zero_copy_only=False))
        if bad.size:
            raise DataError(
                f"{path}: {bad.size} rows with split not in train/val/test, first lines {first_examples(line[bad])} "
                f"({', '.join(repr(v) for v in split.take(pa.array(bad[:5])).to_pylist())})"
            )
    else:
        split = hash_split(text, val_fraction, test_fraction)
    if "id" in table.column_names:
        try:
            qids = table.column("id").cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise DataError(f"{path}: column 'id' must hold integer query ids") from None
    else:
        qids = pa.array(np.arange(table.num_rows, dtype=np.int64))
    out = pa.table({"id": qids, "text": text, "answers": answers, "split": split})
    for col in table.column_names:
        if col not in ("id", "text", "answers", "split"):
            out = out.append_column(col, table.column(col))
    return out
