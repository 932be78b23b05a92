"""MetaQA (Zhang et al., AAAI 2018): ``kb.txt`` triples and ``{1,2,3}-hop/qa_{dev,test}.txt`` questions.

Entities are bare, unique strings: one node per distinct string, its type inferred from the roles it
plays (the head of every relation is a movie; the tail's type depends on the relation). Dev questions
are split into train / val by a stable hash of the question; test questions (when present) become the
test split, and where a hop has none a stable-hash share of its dev questions does. The bracketed topic entity is kept as query attributes (``topic``, ``topic_id``) and the
brackets are removed from the stored text, so no downstream stage can lean on them. Answers missing
from the graph (the shipped KB is about 96.8% complete) are dropped and counted, as are queries left
with no answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.data.importers import first_examples, hash_split, lookup, progress, read_lines
from seeder.data.store import default_inverse_text, write_dataset
from seeder.system.io import DataError, fingerprint_file, writes_output

# relation name -> (text, inverse text, type of the tail entity)
RELATIONS: dict[str, tuple[str, str, str]] = {
    "directed_by": ("directed by", "directed", "person"),
    "written_by": ("written by", "wrote", "person"),
    "starred_actors": ("starring", "starred in", "person"),
    "release_year": ("released in year", "release year of", "year"),
    "in_language": ("in language", "language of", "language"),
    "has_tags": ("tagged with", "tag of", "tag"),
    "has_genre": ("has genre", "genre of", "genre"),
    "has_imdb_votes": ("has imdb votes", "imdb votes of", "votes"),
    "has_imdb_rating": ("has imdb rating", "imdb rating of", "rating"),
}
# When one string plays several roles (a film titled "1999", a tag that is also a name), the first
# type in this order wins: movie titles and people are what questions are about.
TYPE_PRIORITY = ["movie", "person", "genre", "language", "year", "rating", "votes", "tag", "entity"]
HOPS = (1, 2, 3)


def relation_texts(name: str) -> tuple[str, str, str]:
    """(text, inverse text, tail type) of a relation; unknown relations read as their words."""
    if name in RELATIONS:
        return RELATIONS[name]
    text = name.replace("_", " ").strip() or name
    return text, default_inverse_text(text), "entity"


def read_kb(path: Path) -> tuple[pa.Array, pa.Array, pa.Array, np.ndarray]:
    """(head, relation, tail) string arrays of ``head|relation|tail`` lines and their line numbers; blank
    lines are skipped."""
    lines = read_lines(path)
    line_no = np.arange(1, len(lines) + 1)
    keep = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
    lines = lines.filter(keep)
    line_no = line_no[keep.to_numpy(zero_copy_only=False)]
    parts = pc.split_pattern(lines, "|")
    n_parts = pc.list_value_length(parts).to_numpy()
    bad = np.flatnonzero(n_parts != 3)
    if bad.size:
        raise DataError(
            f"{path}: {bad.size} lines are not head|relation|tail, first lines {first_examples(line_no[bad])} "
            f"(e.g. {lines[int(bad[0])].as_py()!r}); fix or remove them"
        )
    if len(lines) == 0:
        raise DataError(f"{path}: no head|relation|tail lines; the knowledge base needs at least one triple")
    flat = pc.list_flatten(parts)
    heads, rels, tails = (pc.utf8_trim_whitespace(flat.take(pa.array(np.arange(k, len(flat), 3)))) for k in range(3))
    empty = np.flatnonzero(
        pc.or_(pc.equal(pc.utf8_length(heads), 0), pc.equal(pc.utf8_length(tails), 0)).to_numpy(zero_copy_only=False)
        | pc.equal(pc.utf8_length(rels), 0).to_numpy(zero_copy_only=False)
    )
    if empty.size:
        raise DataError(
            f"{path}: {empty.size} lines with an empty head, relation or tail, first lines "
            f"{first_examples(line_no[empty])}; fix or remove them"
        )
    return heads, rels, tails, line_no


def build_graph(
    heads: pa.Array, rels: pa.Array, tails: pa.Array, line_no: np.ndarray
) -> tuple[pa.Table, pa.Table, pa.Table, dict]:
    """Nodes (one per distinct string, typed by role), relations and de-duplicated edges, each edge with
    the line of ``kb.txt`` it first appears on (``source_row``)."""
    names = pc.unique(pa.concat_arrays([heads, tails]))
    names = names.take(pc.array_sort_indices(names))  # sorted: ids do not depend on line order
    rel_names = pc.unique(rels)
    rel_names = rel_names.take(pc.array_sort_indices(rel_names))
    src, dst, rel = lookup(heads, names), lookup(tails, names), lookup(rels, rel_names).astype(np.int32)

    # Unique triples only (a triple listed twice is one fact).
    key = np.stack([src, rel.astype(np.int64), dst], axis=1)
    _, first = np.unique(key, axis=0, return_index=True)
    first.sort()
    duplicates = len(src) - first.size
    src, dst, rel = src[first], dst[first], rel[first]

    rel_info = [relation_texts(r) for r in rel_names.to_pylist()]  # 9 relations: not a hot loop
    type_rank = {t: i for i, t in enumerate(TYPE_PRIORITY)}
    rank = np.full(len(names), type_rank["entity"], dtype=np.int64)
    np.minimum.at(rank, src, type_rank["movie"])
    tail_rank = np.array([type_rank.get(info[2], type_rank["entity"]) for info in rel_info], dtype=np.int64)
    np.minimum.at(rank, dst, tail_rank[rel])
    types = pa.array(np.array(TYPE_PRIORITY, dtype=object)[rank], type=pa.string())

    nodes = pa.table(
        {
            "id": pa.array(np.arange(len(names), dtype=np.int64)),
            "type": types,
            "name": names,
            "text": pc.binary_join_element_wise(names, pc.binary_join_element_wise(" (", types, ""), ")", ""),
        }
    )
    relations = pa.table(
        {
            "id": pa.array(np.arange(len(rel_names), dtype=np.int32)),
            "name": rel_names,
            "text": [info[0] for info in rel_info],
            "inverse_text": [info[1] for info in rel_info],
        }
    )
    edges = pa.table(
        {
            "src": src,
            "dst": dst,
            "relation": rel,
            "source_file": np.zeros(len(src), dtype=np.int32),
            "source_row": line_no[first].astype(np.int64),
        }
    )
    return nodes, relations, edges, {"duplicate_triples": int(duplicates)}


def read_questions(path: Path, hop: int, names: pa.Array) -> tuple[pa.Table, dict[str, int]]:
    """Questions of one file with answers resolved to node ids; unknown answers dropped and counted."""
    lines = read_lines(path)
    line_no = np.arange(1, len(lines) + 1)
    parts = pc.split_pattern(lines, "\t", max_splits=1)
    bad = np.flatnonzero(pc.list_value_length(parts).to_numpy() != 2)
    if bad.size:
        raise DataError(
            f"{path}: {bad.size} lines are not 'question<TAB>answer|answer', first lines "
            f"{first_examples(line_no[bad])}; fix or remove them"
        )
    flat = pc.list_flatten(parts)
    raw_question = flat.take(pa.array(np.arange(0, len(flat), 2)))
    answer_field = flat.take(pa.array(np.arange(1, len(flat), 2)))
    topic = pc.extract_regex(raw_question, r"\[(?P<topic>[^\]]*[^\]\s][^\]]*)\]")  # not blank inside
    no_topic = np.flatnonzero(pc.is_null(topic).to_numpy(zero_copy_only=False))
    if no_topic.size:
        raise DataError(
            f"{path}: {no_topic.size} questions without a [topic entity], first lines "
            f"{first_examples(line_no[no_topic])}; MetaQA marks the topic entity with brackets"
        )
    topic = pc.utf8_trim_whitespace(pc.struct_field(topic, [0]))
    text = pc.utf8_trim_whitespace(pc.replace_substring_regex(raw_question, r"[\[\]]", ""))

    qtype_path = path.with_name(path.stem + "_qtype.txt")
    if qtype_path.exists():
        qtype = pc.utf8_trim_whitespace(read_lines(qtype_path))
        if len(qtype) != len(lines):
            raise DataError(f"{qtype_path}: {len(qtype)} lines but {path} has {len(lines)}; the files must align line by line")
    else:
        qtype = pa.nulls(len(lines), pa.string())

    answer_lists = pc.split_pattern(answer_field, "|")
    lengths = pc.list_value_length(answer_lists).to_numpy()
    answer_ids = lookup(pc.utf8_trim_whitespace(pc.list_flatten(answer_lists)), names)
    found = answer_ids >= 0
    owner = np.repeat(np.arange(len(lines)), lengths)
    kept_per_query = np.bincount(owner[found], minlength=len(lines))
    # De-duplicate answers within a query (a name listed twice is one answer).
    pairs = np.unique(np.stack([owner[found], answer_ids[found]], axis=1), axis=0)
    kept_per_query = np.bincount(pairs[:, 0], minlength=len(lines))
    offsets = np.zeros(len(lines) + 1, dtype=np.int32)
    np.cumsum(kept_per_query, out=offsets[1:])
    answers = pa.ListArray.from_arrays(pa.array(offsets), pa.array(pairs[:, 1], type=pa.int64()))

    topic_ids = lookup(topic, names)
    table = pa.table(
        {
            "line": line_no,
            "text": text,
            "answers": answers,
            "hop": pa.array(np.full(len(lines), hop, dtype=np.int64)),
            "qtype": qtype,
            "topic": topic,
            "topic_id": pa.array(topic_ids, mask=topic_ids < 0, type=pa.int64()),
            "raw": raw_question,
        }
    )
    keep = kept_per_query > 0
    stats = {
        "questions": int(len(lines)),
        "answers_dropped": int((~found).sum()),
        "queries_dropped": int((~keep).sum()),
        "topics_missing": int((topic_ids < 0).sum()),
    }
    return table.filter(pa.array(keep)), stats


@writes_output
def import_metaqa(
    root: str | Path,
    out: str | Path,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Import a MetaQA folder into dataset directory ``out``; returns the source summary (also in the manifest).

    ``test_fraction`` of the dev questions become the test split for each hop whose ``qa_test.txt`` is absent
    (the shared copy ships dev files only), so a model chosen on val is still scored on held-out questions.
    """
    root = Path(root)
    kb_path = root / "kb.txt"
    if not kb_path.exists():
        raise DataError(f"{kb_path}: not found; --root must be the MetaQA folder holding kb.txt and 1-hop/ ...")
    progress(f"metaqa: reading {kb_path}")
    heads, rels, tails, line_no = read_kb(kb_path)
    nodes, relations, edges, graph_stats = build_graph(heads, rels, tails, line_no)
    progress(f"metaqa: {nodes.num_rows:,} entities, {edges.num_rows:,} unique triples, {relations.num_rows} relations")
    names = nodes.column("name").combine_chunks()

    tables, per_file, inputs = [], {}, {"kb.txt": fingerprint_file(kb_path)}
    for hop in HOPS:
        for part in ("dev", "test"):
            path = root / f"{hop}-hop" / f"qa_{part}.txt"
            if not path.exists():  # a directory in its place is an error (read_lines), not a missing file
                continue
            table, stats = read_questions(path, hop, names)
            rel_path = path.relative_to(root).as_posix()
            inputs[rel_path] = fingerprint_file(path)
            if part == "dev":
                has_test = (root / f"{hop}-hop" / "qa_test.txt").exists()
                split = hash_split(table.column("raw"), val_fraction, 0.0 if has_test else test_fraction)
            else:
                split = pa.array(np.full(table.num_rows, "test", dtype=object), type=pa.string())
            # Stable ids: hop, file and line number (ids survive a change of split fraction).
            ids = hop * 10_000_000 + (0 if part == "dev" else 5_000_000) + table.column("line").to_numpy()
            table = table.append_column("split", split).append_column("id", pa.array(ids, type=pa.int64()))
            tables.append(table)
            per_file[rel_path] = stats
            progress(
                f"metaqa: {rel_path}: {stats['questions']:,} questions, {stats['answers_dropped']:,} answers not in "
                f"the graph dropped, {stats['queries_dropped']:,} queries left without answers dropped"
            )
    if not tables:
        raise DataError(f"{root}: no {{1,2,3}}-hop/qa_dev.txt or qa_test.txt files; is --root the MetaQA folder?")
    queries = pa.concat_tables(tables).select(["id", "text", "answers", "split", "hop", "qtype", "topic", "topic_id"])

    totals = {k: sum(s[k] for s in per_file.values()) for k in next(iter(per_file.values()))}
    source = {
        "format": "metaqa",
        "root": str(root),
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "inputs": inputs,
        "duplicate_triples": graph_stats["duplicate_triples"],
        "questions": per_file,
        "totals": totals,
    }
    edge_sources = [{"file": kb_path.name, "unit": "line"}]
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite, edge_sources=edge_sources)
    counts = pc.value_counts(queries.column("split")).to_pylist()
    progress(
        f"metaqa: wrote {out}: {queries.num_rows:,} queries ("
        + ", ".join(f"{d['values']} {d['counts']:,}" for d in counts)
        + f"); dropped {totals['answers_dropped']:,} answers and {totals['queries_dropped']:,} queries"
        f" whose answers are not in the graph"
    )
    return source
