"""Do the retrieved nodes' paths hold, and do they read like the question? On a split's question texts:

    python benchmarks/bench_paths.py --model runs/metaqa/model/model [--split val] [--questions 1000]

1. every hop of every retrieved node's path (``RetrievedNode.path``) is checked against the graph's
   edges: the share of paths whose every hop is an edge, in the direction the hop names;
2. for answers at rank 1, whether the path's relations (with their directions) are the question type's
   relation path, overall and among the answers that the graph joins to the question's topic entity
   (``--topic``) by a walk of that path at all (MetaQA's questions come from a fuller graph than its
   ``kb.txt``: "who directed Lost Christmas" is answered by its writer, and the graph holds no
   directed_by edge of the film), where a type's path is the golden relation path (``seeder.retrieve.paths``) that the
   most training questions of that type have among their golden paths (not only as their most precise
   one: where writers often direct, "the languages of the films by the writer of X" is reached most
   precisely through the director for many questions, though its path is the writer's; needs artifacts built with
   ``expand.relation_score: learned``, which keep the golden paths, and a question-type attribute,
   ``--by``, e.g. MetaQA's ``qtype``);
3. the paths' cost: the time spent choosing them (``seeder.serving.explain.expansion_paths``) as a share
   of the ``retrieve`` calls, in calls of ``--batch`` questions.

Figures only, nothing asserted.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory, runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts (default: the model's)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--questions", type=int, default=1000, help="questions of the split (a seeded sample)")
    parser.add_argument("--by", default="qtype", help="the question-type attribute")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="questions per retrieve call")
    parser.add_argument("--topic", default="topic_id", help="the attribute naming a question's topic entity (node id)")
    parser.add_argument(
        "--show-misses",
        type=int,
        default=0,
        help="print this many rank-1 answers whose path is not the type's, though the graph holds one",
    )
    args = parser.parse_args(argv)

    import time

    import seeder.serving.retriever as retriever_module
    from seeder import Retriever
    from seeder.retrieve.paths import decode

    retriever = Retriever.load(args.model, artifacts=args.artifacts)
    kg = retriever.artifacts.dataset
    names = np.array(kg.nodes.column("name").to_pylist(), dtype=object)
    relation_names = list(kg.relation_names)
    num_relations = kg.num_relations  # R base relations; inverse r is r + R
    edges = kg.table("edges")
    facts = set(
        zip(
            names[edges.column("src").to_numpy()].tolist(),
            np.array(relation_names, dtype=object)[edges.column("relation").to_numpy()].tolist(),
            names[edges.column("dst").to_numpy()].tolist(),
        )
    )
    queries = kg.queries_of(args.split)
    rows = np.sort(np.random.default_rng(0).permutation(queries.num_rows)[: args.questions])
    sample = queries.take(rows)
    texts = sample.column("text").to_pylist()
    retriever.retrieve(texts[: args.batch], k=args.k)  # warm up: indexes, compiled kernels
    choosing = [0.0]
    explain = retriever_module.expansion_paths

    def timed_paths(*a, **kw):
        start = time.perf_counter()
        out = explain(*a, **kw)
        choosing[0] += time.perf_counter() - start
        return out

    retriever_module.expansion_paths = timed_paths
    start, hits = time.perf_counter(), []
    for i in range(0, len(texts), args.batch):
        hits += retriever.retrieve(texts[i : i + args.batch], k=args.k)
    total = time.perf_counter() - start
    retriever_module.expansion_paths = explain
    print(
        f"retrieve: {total:.2f} s for {len(texts):,} questions in calls of {args.batch}; choosing the paths "
        f"{choosing[0]:.2f} s of it ({choosing[0] / total:.3f})"
    )

    checked = held = 0
    for h in hits:
        for node in h.nodes:
            if node.path:
                checked += 1
                held += all((a, r, b) in facts if d == "forward" else (b, r, a) in facts for a, r, d, b in node.path)
    print(f"paths checked edge by edge: {checked:,}; every hop an edge of the graph: {held:,} ({held / max(checked, 1):.4f})")

    if args.by not in queries.column_names or "paths" not in retriever.artifacts.manifest.get("stages", {}):
        print(f"no type paths: the split has no {args.by!r} attribute or the artifacts keep no golden paths")
        return 0
    parts = sorted((Path(retriever.artifacts.path) / "paths").glob("part-*.parquet"))
    golden = pa.concat_tables([pq.read_table(part) for part in parts])
    train = kg.queries_of("train")
    type_of = dict(zip(train.column("id").to_pylist(), train.column(args.by).to_pylist()))
    per_type: dict[str, Counter] = {}
    for qid, code in zip(golden.column("query_id").to_pylist(), golden.column("code").to_pylist()):
        if qid in type_of:
            per_type.setdefault(type_of[qid], Counter())[code] += 1
    type_path = {t: decode(c.most_common(1)[0][0], 2 * num_relations) for t, c in per_type.items()}

    answers = sample.column("answers").to_pylist()
    types = sample.column(args.by).to_pylist()
    topics = sample.column(args.topic).to_pylist() if args.topic in sample.column_names else [None] * len(hits)
    from seeder.data.ragged import ranges

    indptr, neighbors, walked_ids = np.asarray(kg.indptr), np.asarray(kg.neighbors), np.asarray(kg.edge_relations)

    def type_path_reaches(topic: int, path: list[int], answer: int) -> bool:
        """Whether the graph holds a walk from the question's topic entity to ``answer`` that follows
        ``path`` (relation ids as walked, r + R against r), one hop a relation."""
        frontier = np.array([topic], np.int64)
        for relation in path:
            pos = ranges(indptr[frontier], indptr[frontier + 1] - indptr[frontier])
            frontier = np.unique(neighbors[pos[walked_ids[pos] == relation]])
        return bool(np.isin(answer, frontier))

    top, same, possible, same_possible = 0, 0, 0, 0
    for h, wanted, kind, topic in zip(hits, answers, types, topics):
        if not h.nodes or h.nodes[0].id not in set(wanted) or kind not in type_path:
            continue
        top += 1
        ids = [relation_names.index(r) + (0 if d == "forward" else num_relations) for _, r, d, _ in h.nodes[0].path]
        same += ids == type_path[kind]
        reachable = topic is None or type_path_reaches(int(topic), type_path[kind], h.nodes[0].id)
        possible += reachable
        same_possible += reachable and ids == type_path[kind]
        if reachable and ids != type_path[kind] and args.show_misses > 0:
            args.show_misses -= 1
            walked = " ".join(f"{r}{'' if d == 'forward' else '^-1'}" for _, r, d, _ in h.nodes[0].path)
            wanted_path = " ".join(
                relation_names[i % num_relations] + ("" if i < num_relations else "^-1") for i in type_path[kind]
            )
            print(f"  miss [{kind}] {h.question!r}: {h.nodes[0].name!r} by {walked or '(seed)'}; type path {wanted_path}")
    print(f"answers at rank 1: {top:,}; path's relations equal the type's relation path: {same:,} ({same / max(top, 1):.4f})")
    print(
        f"  of them, answers the graph joins to the question's {args.topic!r} by a walk of the type's path: {possible:,}; "
        f"explained by that path: {same_possible:,} ({same_possible / max(possible, 1):.4f}); "
        f"the other {top - possible:,} have no such walk in the graph (a fact the questions assume and the graph lacks)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
