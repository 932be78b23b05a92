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


def _as_strings(table: pa.Table, column: str, path: Path) -> pa.Array:
    col = table.column(column).combine_chunks()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type)):
        raise DataError(f"{path}: column '{column}' has type {col.type}; expected strings or integer ids")
    return pc.utf8_trim_whitespace(col.cast(pa.string()))


def _empty_rows(values: pa.Array) -> np.ndarray:
    return np.flatnonzero(pc.or_(pc.is_null(values), pc.equal(pc.utf8_length(values), 0)).to_numpy(zero_copy_only=False))


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
    table = read_table(triples, header=not no_header)
    cols = [head_col, relation_col, tail_col]
    if no_header and table.num_columns != 3:
        raise DataError(f"{triples}: {table.num_columns} columns, expected 3 (head, relation, tail) in a file without a header")
    if not set(cols) <= set(table.column_names):
        if table.num_columns != 3:
            raise DataError(
                f"{triples}: no columns {', '.join(cols)} (have: {', '.join(table.column_names)}); name them with "
                f"--head-col/--relation-col/--tail-col or give a file with exactly three columns"
            )
        cols = table.column_names
    first_line = 1 if no_header else 2
    heads, rels, tails = (_as_strings(table, c, triples) for c in cols)
    for label, values in (("head", heads), ("relation", rels), ("tail", tails)):
        empty = _empty_rows(values)
        if empty.size:
            raise DataError(
                f"{triples}: {empty.size} rows with an empty {label}, first lines {first_examples(empty + first_line)}; "
                f"fill or remove them"
            )

    inputs = {triples.name: fingerprint_file(triples)}
    keys = pc.unique(pa.concat_arrays([heads, tails]))
    types = pa.array(np.full(len(keys), "entity", dtype=object), pa.string())
    names, texts = keys, keys
    if nodes_path is not None:
        nodes_path = Path(nodes_path)
        node_table = read_table(nodes_path)  # every column a string: ids, names, types and texts
        key_col = "id" if "id" in node_table.column_names else "name" if "name" in node_table.column_names else None
        if key_col is None or "text" not in node_table.column_names:
            raise DataError(
                f"{nodes_path}: needs columns id (or name) and text, optional type (have: {', '.join(node_table.column_names)})"
            )
        node_keys = _as_strings(node_table, key_col, nodes_path)
        order = pc.array_sort_indices(node_keys)
        sorted_keys = node_keys.take(order).to_numpy(zero_copy_only=False)
        dup = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        if dup.size:
            rows = order.to_numpy()[dup + 1] + 2
            raise DataError(
                f"{nodes_path}: {dup.size} duplicate node ids, first {first_examples(sorted_keys[dup])} "
                f"(lines {first_examples(rows)}); every node id must appear once"
            )
        node_text = pc.utf8_trim_whitespace(node_table.column("text").combine_chunks().cast(pa.string()))
        empty = _empty_rows(node_text)
        if empty.size:
            raise DataError(
                f"{nodes_path}: {empty.size} nodes with empty text, first lines {first_examples(empty + 2)}; "
                f"give every node a text or drop its row"
            )
        inputs[nodes_path.name] = fingerprint_file(nodes_path)
        # Nodes listed in the node file but in no triple are kept (isolated nodes are still answers).
        keys = pc.unique(pa.concat_arrays([node_keys, keys]))
        row = lookup(keys, node_keys)
        has = row >= 0
        safe = np.where(has, row, 0)
        texts = pa.array(
            np.where(has, node_text.take(pa.array(safe)).to_numpy(zero_copy_only=False), keys.to_numpy(zero_copy_only=False)),
            pa.string(),
        )
        names = keys
        if key_col == "id" and "name" in node_table.column_names:
            node_names = _as_strings(node_table, "name", nodes_path).fill_null("")
            chosen = node_names.take(pa.array(safe)).to_numpy(zero_copy_only=False)
            names = pa.array(np.where(has & (chosen != ""), chosen, keys.to_numpy(zero_copy_only=False)), pa.string())
        types = pa.array(np.full(len(keys), "entity", dtype=object), pa.string())
        if "type" in node_table.column_names:
            node_type = _as_strings(node_table, "type", nodes_path).fill_null("entity")
            chosen = node_type.take(pa.array(safe)).to_numpy(zero_copy_only=False)
            types = pa.array(np.where(has & (chosen != ""), chosen, "entity"), pa.string())

    rel_names = pc.unique(rels)
    rel_names = rel_names.take(pc.array_sort_indices(rel_names))
    rel_text = pc.utf8_trim_whitespace(pc.replace_substring(rel_names, "_", " "))
    # A relation named only of underscores ("_") would get an empty text: it reads as its name instead.
    rel_text = pc.if_else(pc.equal(pc.utf8_length(rel_text), 0), rel_names, rel_text)
    nodes = pa.table({"id": pa.array(np.arange(len(keys), dtype=np.int64)), "type": types, "name": names, "text": texts})
    relations = pa.table(
        {
            "id": pa.array(np.arange(len(rel_names), dtype=np.int32)),
            "name": rel_names,
            "text": rel_text,
            "inverse_text": pa.array([default_inverse_text(t) for t in rel_text.to_pylist()], pa.string()),
        }
    )
    src, dst, rel = lookup(heads, keys), lookup(tails, keys), lookup(rels, rel_names).astype(np.int32)
    # A triple listed twice is one fact (as in the MetaQA importer): keep its first row, count the rest.
    _, first = np.unique(np.stack([src, rel.astype(np.int64), dst], axis=1), axis=0, return_index=True)
    first.sort()
    duplicates = len(src) - first.size
    edges = pa.table({"src": src[first], "dst": dst[first], "relation": rel[first]})
    progress(
        f"triples: {nodes.num_rows:,} nodes, {edges.num_rows:,} edges, {relations.num_rows} relations; "
        f"{duplicates:,} duplicate triples dropped"
    )

    if queries_path is not None:
        queries_path = Path(queries_path)
        queries = read_queries(queries_path, keys, val_fraction, test_fraction)
        inputs[queries_path.name] = fingerprint_file(queries_path)
    else:
        queries = pa.table(
            {
                "id": pa.array([], pa.int64()),
                "text": pa.array([], pa.string()),
                "answers": pa.array([], pa.list_(pa.int64())),
                "split": pa.array([], pa.string()),
            }
        )
    source = {"format": "triples", "triples": str(triples), "inputs": inputs, "duplicate_triples": int(duplicates)}
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite)
    progress(f"triples: wrote {out}: {queries.num_rows:,} queries")
    return source


def read_queries(path: Path, keys: pa.Array, val_fraction: float, test_fraction: float) -> pa.Table:
    """Queries with answers resolved to node ids; unknown answers are errors naming the line."""
    # Answers are node ids: strings, like the triples' ids. Other columns keep their types (attributes).
    table = read_table(path, string_columns=("text", "answers", "split"))
    for col in ("text", "answers"):
        if col not in table.column_names:
            raise DataError(
                f"{path}: missing column '{col}' (have: {', '.join(table.column_names)}); a queries file needs "
                f"text and answers (node ids separated by |), optional split and id"
            )
    line = np.arange(table.num_rows) + 2
    text = pc.utf8_trim_whitespace(table.column("text").combine_chunks().cast(pa.string()))
    empty = _empty_rows(text)
    if empty.size:
        raise DataError(f"{path}: {empty.size} queries with empty text, first lines {first_examples(line[empty])}")
    answer_field = _as_strings(table, "answers", path).fill_null("")
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
        split = _as_strings(table, "split", path).fill_null("")
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
