"""STaRK (Wu et al., NeurIPS 2024): a ``processed/`` knowledge base plus ``stark_qa/`` queries and ``split/``.

The knowledge base is STaRK's own layout: ``node_info.pkl`` (node id -> dict of fields),
``edge_index.pt`` (LongTensor [2, E]), ``edge_types.pt`` ([E]), ``node_types.pt`` ([N]),
``node_type_dict.pkl`` and ``edge_type_dict.pkl`` (type id -> name). The two ``.pkl`` files are
Python pickles: loading one can run arbitrary code, so import only knowledge bases from a source you
trust (STaRK's own release). Tensors are loaded with ``weights_only=True``.

Node text follows STaRK's document text: ``- type: ...``, ``- name: ...``, then one ``- field: value``
line per other field present, each value and the whole text bounded in length.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from seeder.data.importers import check_utf8, first_examples, progress, read_lines
from seeder.data.store import SPLITS, default_inverse_text, write_dataset
from seeder.system.io import DataError, fingerprint_file, writes_output

NAME_FIELDS = ("name", "title", "display_name")
MAX_VALUE_CHARS = 300
MAX_TEXT_CHARS = 2_000
KB_FILES = ("node_info.pkl", "edge_index.pt", "edge_types.pt", "node_types.pt", "node_type_dict.pkl", "edge_type_dict.pkl")


def _value_text(value: Any) -> str:
    if isinstance(value, (list, tuple, set)):
        text = ", ".join(_value_text(v) for v in list(value)[:20])
    elif isinstance(value, dict):
        text = "; ".join(f"{k}: {_value_text(v)}" for k, v in list(value.items())[:20])
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def node_document(node_type: str, info: dict[str, Any] | None, node_id: int) -> tuple[str, str]:
    """(name, text) of one node: STaRK-style ``- key: value`` lines over whatever fields it has."""
    info = info or {}
    name = next((_value_text(info[k]) for k in NAME_FIELDS if info.get(k) not in (None, "", [])), "")
    name = name or f"{node_type} {node_id}"
    lines = [f"- type: {node_type}", f"- name: {name}"]
    for key, value in info.items():
        if key in NAME_FIELDS or value is None or value == "" or (isinstance(value, float) and np.isnan(value)):
            continue
        lines.append(f"- {str(key).replace('_', ' ')}: {_value_text(value)}")
    text = "\n".join(lines)
    return name, text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 3] + "..."


def relation_text(name: str) -> str:
    """``author___writes___paper`` -> ``writes``; ``off-label use`` stays; underscores become spaces."""
    parts = [p for p in name.split("___") if p]
    core = parts[1] if len(parts) == 3 else name
    return " ".join(core.replace("_", " ").split()) or name


def _load_pickle(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)  # trusted input only: see the module docstring and --help
    except Exception as exc:  # damaged bytes raise many types (ValueError, OverflowError, MemoryError, ...)
        raise DataError(
            f"{path}: not a readable pickle ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
            "re-download STaRK's processed/ folder"
        ) from None


def _load_tensor(path: Path, dims: int) -> np.ndarray:
    import torch  # torch only on this path

    try:
        tensor = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt file
        raise DataError(f"{path}: not a readable torch tensor file ({exc})") from None
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims or tensor.is_floating_point():
        raise DataError(
            f"{path}: expected an integer tensor with {dims} dimension(s), got {type(tensor).__name__}"
            + (f" of shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else "")
        )
    return tensor.numpy().astype(np.int64, copy=False)


def read_kb(kb: str | Path) -> tuple[pa.Table, pa.Table, pa.Table, dict[str, str]]:
    """Nodes, relations and edges of a STaRK ``processed/`` folder (validated against each other)."""
    kb = Path(kb)
    missing = [f for f in KB_FILES if not (kb / f).is_file()]
    if missing:
        raise DataError(f"{kb}: missing {', '.join(missing)}; --kb must be STaRK's processed/ folder")
    node_types = _load_tensor(kb / "node_types.pt", 1)
    edge_index = _load_tensor(kb / "edge_index.pt", 2)
    edge_types = _load_tensor(kb / "edge_types.pt", 1)
    node_type_dict = _load_pickle(kb / "node_type_dict.pkl")
    edge_type_dict = _load_pickle(kb / "edge_type_dict.pkl")
    node_info = _load_pickle(kb / "node_info.pkl")
    for name, table in (("node_type_dict.pkl", node_type_dict), ("edge_type_dict.pkl", edge_type_dict)):
        if (
            not isinstance(table, dict)
            or not table
            or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in table)
        ):
            raise DataError(
                f"{kb / name}: expected a non-empty dict of integer type id -> name, got "
                f"{type(table).__name__}; use STaRK's own {name}"
            )
    if edge_index.shape[0] != 2:
        raise DataError(f"{kb / 'edge_index.pt'}: shape {edge_index.shape}, expected [2, E]")
    if edge_types.shape[0] != edge_index.shape[1]:
        raise DataError(f"{kb / 'edge_types.pt'}: {edge_types.shape[0]} types for {edge_index.shape[1]} edges in edge_index.pt")
    n = node_types.shape[0]
    outside = np.flatnonzero(((edge_index < 0) | (edge_index >= n)).any(axis=0))
    if outside.size:
        raise DataError(
            f"{kb / 'edge_index.pt'}: {outside.size} edges name nodes outside 0..{n - 1} (the {n} nodes of "
            f"node_types.pt), first edges {first_examples(outside)} with ends "
            f"{first_examples(tuple(edge_index[:, i].tolist()) for i in outside[:5])}; use the files of one STaRK release"
        )
    unknown_types = np.setdiff1d(np.unique(node_types), np.array(sorted(node_type_dict), dtype=np.int64))
    if unknown_types.size:
        raise DataError(f"{kb / 'node_types.pt'}: node type ids {first_examples(unknown_types)} are not in node_type_dict.pkl")
    if not isinstance(node_info, dict):
        raise DataError(f"{kb / 'node_info.pkl'}: expected a dict node id -> fields, got {type(node_info).__name__}")
    not_fields = [k for k, v in node_info.items() if v is not None and not isinstance(v, dict)]
    if not_fields:
        raise DataError(
            f"{kb / 'node_info.pkl'}: {len(not_fields)} values are not dicts of fields, first node ids "
            f"{first_examples(not_fields)} (e.g. a {type(node_info[not_fields[0]]).__name__}); use STaRK's own node_info.pkl"
        )
    extra = [k for k in node_info if not (isinstance(k, (int, np.integer)) and 0 <= k < n)]
    if extra:
        raise DataError(
            f"{kb / 'node_info.pkl'}: {len(extra)} keys are not node ids 0..{n - 1} of node_types.pt, "
            f"first: {first_examples(extra)}"
        )

    type_names = np.array([str(node_type_dict[t]) for t in sorted(node_type_dict)], dtype=object)
    type_index = np.searchsorted(np.array(sorted(node_type_dict), dtype=np.int64), node_types)
    types = type_names[type_index]
    # node_info holds Python dicts: building their documents is inherently one call per node.
    names, texts = [], []
    step = max(n // 10, 1)
    for i in range(n):
        name, text = node_document(types[i], node_info.get(i), i)
        names.append(name)
        texts.append(text)
        if (i + 1) % step == 0:
            progress(f"stark: node documents {i + 1:,}/{n:,}")
    nodes = pa.table(
        {"id": pa.array(np.arange(n, dtype=np.int64)), "type": pa.array(types, pa.string()), "name": names, "text": texts}
    )

    rel_keys = np.array(sorted(edge_type_dict), dtype=np.int64)
    rel_names = [str(edge_type_dict[k]) for k in rel_keys]
    relation = np.searchsorted(rel_keys, edge_types)
    bad = (relation >= rel_keys.size) | (rel_keys[np.minimum(relation, rel_keys.size - 1)] != edge_types)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise DataError(
            f"{kb / 'edge_types.pt'}: {rows.size} edges have types not in edge_type_dict.pkl, first edges "
            f"{first_examples(rows)} with types {first_examples(edge_types[rows])}"
        )
    texts_r = [relation_text(r) for r in rel_names]
    relations = pa.table(
        {
            "id": pa.array(np.arange(len(rel_names), dtype=np.int32)),
            "name": rel_names,
            "text": texts_r,
            "inverse_text": [default_inverse_text(t) for t in texts_r],
        }
    )
    edges = pa.table({"src": edge_index[0], "dst": edge_index[1], "relation": relation.astype(np.int32)})
    fingerprints = {f: fingerprint_file(kb / f) for f in KB_FILES}
    return nodes, relations, edges, fingerprints


def read_queries(qa: str | Path, num_nodes: int | None = None) -> pa.Table:
    """STaRK queries (``stark_qa/stark_qa.csv``) with their split from ``split/{train,val,test}.index``.

    ``answer_ids`` is a Python list literal, parsed with ``ast.literal_eval`` (never ``eval``).
    Errors name the CSV line. With ``num_nodes`` given, answers outside the graph are errors.
    """
    qa = Path(qa)
    csv_path = qa / "stark_qa" / "stark_qa.csv"
    if csv_path.is_dir():
        raise DataError(f"{csv_path}: is a directory, expected a file")
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: not found; --qa must be the folder holding stark_qa/ and split/")
    check_utf8(csv_path)
    try:
        table = pacsv.read_csv(
            csv_path,
            convert_options=pacsv.ConvertOptions(
                column_types={"id": pa.int64(), "query": pa.string(), "answer_ids": pa.string()}
            ),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
        )
    except pa.ArrowInvalid as exc:
        raise DataError(f"{csv_path}: cannot parse as CSV with columns id,query,answer_ids ({exc})") from None
    for col in ("id", "query", "answer_ids"):
        if col not in table.column_names:
            raise DataError(f"{csv_path}: missing column '{col}' (have: {', '.join(table.column_names)})")
    ids = table.column("id").to_numpy()
    line = np.arange(table.num_rows) + 2  # header is line 1 (exact when no field spans lines)

    answers: list[list[int]] = []
    for row, literal in enumerate(table.column("answer_ids").to_pylist()):
        try:
            value = ast.literal_eval(literal) if literal is not None else None
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise DataError(
                f"{csv_path}: line {line[row]} (query id {ids[row]}): answer_ids {literal!r} is not a list of "
                f"integer node ids such as [12, 40]"
            )
        if not value:
            raise DataError(f"{csv_path}: line {line[row]} (query id {ids[row]}) has no answers; remove the query")
        answers.append(list(dict.fromkeys(value)))
    answer_array = pa.array(answers, type=pa.list_(pa.int64()))
    if num_nodes is not None:
        flat = pc.list_flatten(answer_array).to_numpy()
        owner = np.repeat(np.arange(table.num_rows), pc.list_value_length(answer_array).to_numpy())
        bad = (flat < 0) | (flat >= num_nodes)
        if bad.any():
            rows = owner[bad]
            raise DataError(
                f"{csv_path}: {bad.sum()} answer ids are not nodes of the knowledge base (0..{num_nodes - 1}), "
                f"first at lines {first_examples(line[rows])} (answer ids {first_examples(flat[bad])}); "
                f"use the knowledge base these queries were written for"
            )

    split = np.full(table.num_rows, "", dtype=object)
    order = np.argsort(ids, kind="stable")
    dup = ids[order][1:][np.diff(ids[order]) == 0]
    if dup.size:
        raise DataError(f"{csv_path}: duplicate query ids {first_examples(dup)}; ids must be unique")
    for name in SPLITS:
        index_path = qa / "split" / f"{name}.index"
        if index_path.is_dir():
            raise DataError(f"{index_path}: is a directory, expected a file")
        if not index_path.is_file():
            raise DataError(f"{index_path}: not found; STaRK ships split/train.index, val.index and test.index")
        raw = pc.utf8_trim_whitespace(read_lines(index_path))
        raw = raw.filter(pc.greater(pc.utf8_length(raw), 0))
        try:
            split_ids = raw.cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid:
            raise DataError(f"{index_path}: every line must be an integer query id") from None
        pos = np.searchsorted(ids[order], split_ids)
        found = (pos < ids.size) & (ids[order][np.minimum(pos, ids.size - 1)] == split_ids)
        if not found.all():
            raise DataError(
                f"{index_path}: {int((~found).sum())} query ids are not in {csv_path}, first: {first_examples(split_ids[~found])}"
            )
        rows = order[pos]
        clash = rows[split[rows] != ""]
        if clash.size:
            raise DataError(f"{index_path}: query ids {first_examples(ids[clash])} are already in another split")
        split[rows] = name
    unsplit = np.flatnonzero(split == "")
    if unsplit.size:
        raise DataError(
            f"{csv_path}: {unsplit.size} queries are in no split/*.index file, first ids {first_examples(ids[unsplit])}"
        )
    return pa.table({"id": ids, "text": table.column("query"), "answers": answer_array, "split": pa.array(split, pa.string())})


@writes_output
def import_stark(kb: str | Path, qa: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Import a STaRK knowledge base and its queries into dataset directory ``out``."""
    progress(f"stark: reading knowledge base {kb}")
    nodes, relations, edges, fingerprints = read_kb(kb)
    progress(f"stark: {nodes.num_rows:,} nodes, {edges.num_rows:,} edges, {relations.num_rows} relations")
    queries = read_queries(qa, num_nodes=nodes.num_rows)
    counts = {d["values"]: d["counts"] for d in pc.value_counts(queries.column("split")).to_pylist()}
    source = {"format": "stark", "kb": str(kb), "qa": str(qa), "inputs": fingerprints, "queries_per_split": counts}
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite)
    progress(f"stark: wrote {out}: {queries.num_rows:,} queries ({', '.join(f'{k} {v:,}' for k, v in counts.items())})")
    return source
