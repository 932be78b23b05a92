"""``seeder retrieve``: rank the nodes of new questions with a trained SeedER model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from seeder.cli.arguments import add_accept_mismatch_argument, add_compile_argument, add_encoder_precision_argument, positive_int
from seeder.serving.retriever import Hits, Retriever
from seeder.system.io import DataError


def _read_questions(path: str) -> list[str]:
    """One question per line of a text file (blank lines skipped), or the ``question`` column of a
    Parquet/CSV/JSONL file."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--file {path}: no such file")
    if p.suffix in (".parquet", ".csv", ".jsonl"):
        import pandas as pd  # only for a table of questions

        frame = {".parquet": pd.read_parquet, ".csv": pd.read_csv, ".jsonl": lambda f: pd.read_json(f, lines=True)}[p.suffix](p)
        if "question" not in frame.columns:
            raise DataError(f"--file {path}: no 'question' column (columns: {', '.join(map(str, frame.columns))})")
        questions = frame["question"].astype(str).tolist()
    else:
        questions = [line.strip() for line in p.read_text(encoding="utf-8-sig").splitlines()]
        questions = [q for q in questions if q]
    if not questions:
        raise DataError(f"--file {path}: no questions in it")
    return questions


def _write_results(hits: list[Hits], out: str) -> None:
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    if target.suffix == ".parquet":
        rows = [
            {
                "question": h.question,
                "set_size": h.set_size,
                "nodes": [n.to_dict() for n in h.nodes],
                "triples": [list(t) for t in h.triples],
            }
            for h in hits
        ]
        pq.write_table(pa.Table.from_pylist(rows), tmp)
    else:
        tmp.write_text("".join(json.dumps(h.to_dict(), ensure_ascii=False) + "\n" for h in hits), encoding="utf-8")
    tmp.replace(target)


def _print_trace(hits: Hits) -> None:
    print(f"question: {hits.question}")
    print(f"{'rank':>4}  {'node':>8}  {'score':>8}  {'step':>4}  name")
    for node in hits.nodes:
        where = "seed" if node.step == 0 else (f"t={node.step}" if node.step > 0 else "-")
        note = "" if node.rank <= hits.set_size else "   (outside the retrieved set; filter score)"
        print(f"{node.rank:>4}  {node.id:>8}  {node.score:>8.3f}  {where:>4}  {node.name}{note}")
    if hits.triples:
        print(f"triples among the top {len(hits.nodes)} ({len(hits.triples)}):")
        for h, r, t in hits.triples:
            print(f"  ({h}, {r}, {t})")


def _where(pairs: list[str] | None) -> dict[str, list[str]] | None:
    """``--where COLUMN=VALUE`` flags as ``Retriever.retrieve``'s ``where``: the values of each column."""
    if not pairs:
        return None
    where: dict[str, list[str]] = {}
    for pair in pairs:
        column, sep, value = pair.partition("=")
        if not sep or not column:
            raise DataError(f"--where {pair!r}: write COLUMN=VALUE, e.g. --where type=film")
        where.setdefault(column, []).append(value)
    return where


def run(args) -> int:
    if args.question is not None and not args.question.strip():
        raise DataError("the question is empty; give a question with words in it, or --file FILE")
    if bool(args.question) == bool(args.file):
        raise DataError("give one question, or --file FILE with one question per line")
    retriever = Retriever.load(
        args.model,
        artifacts=args.artifacts,
        device=args.device,
        accept_mismatch=args.accept_mismatch,
        encoder_precision=args.encoder_precision,
        compiled=args.compile,
    )
    questions = [args.question] if args.question else _read_questions(args.file)
    where = _where(args.where)
    hits = []
    for lo in range(0, len(questions), args.batch_size):
        hits.extend(retriever.retrieve(questions[lo : lo + args.batch_size], k=args.k, types=args.types, where=where))
        if args.file:
            print(
                f"retrieve: {min(lo + args.batch_size, len(questions))}/{len(questions)} questions", file=sys.stderr, flush=True
            )
    if args.out:
        _write_results(hits, args.out)
        print(f"wrote {len(hits)} results to {args.out}", file=sys.stderr)
    elif args.json:
        for h in hits:
            print(json.dumps(h.to_dict(), ensure_ascii=False))
    else:
        for h in hits:
            _print_trace(h)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "retrieve",
        help="rank the nodes of new questions with a trained SeedER model (one question, or a file of them)",
    )
    parser.add_argument("question", nargs="?", help="one question (prints the expansion trace and the triples)")
    parser.add_argument("--model", required=True, help="model directory (RUN/model), runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts to search (default: the ones the model was trained on)")
    parser.add_argument("--file", help="questions, one per line (or a Parquet/CSV/JSONL file with a 'question' column)")
    parser.add_argument("--out", help="write results here: .jsonl (one JSON object per question) or .parquet")
    parser.add_argument("--json", action="store_true", help="print one JSON object per question instead of the trace")
    parser.add_argument("-k", type=positive_int, default=10, help="nodes per question (default 10)")
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="show only nodes of this type (repeatable); the expansion is unchanged",
    )
    parser.add_argument(
        "--where",
        action="append",
        metavar="COLUMN=VALUE",
        help="show only nodes whose node-table COLUMN holds VALUE (repeatable; a column given twice accepts either value)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=256, help="questions per batched pass (default 256)")
    parser.add_argument("--device", default="cpu", help="torch device of the policy and the encoder (default cpu)")
    add_encoder_precision_argument(parser)
    add_compile_argument(parser)
    add_accept_mismatch_argument(parser)
    parser.set_defaults(func=run)
