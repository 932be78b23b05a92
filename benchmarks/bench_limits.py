"""What the graph allows: answer reachability and the Hit@1 of an oracle that knows the relation path.

    python benchmarks/bench_limits.py --dataset runs/metaqa/dataset [--split val] [--type qtype] [--topic topic_id]

For a dataset whose questions name their topic entity (``--topic``, e.g. MetaQA's ``topic_id``) and
carry a question type (``--type``), it prints per value of ``hop`` (and overall), on ``--split``:

- ``reach_any``: share of questions with an answer within ``hop`` hops of the topic, by any path;
- ``reach_path``: share with an answer at the end of the question type's relation path, the path that
  reaches an answer for the most *training* questions of that type (golden paths of the train split;
  the split's own answers only score it);
- ``path_nodes``: mean number of nodes at that path's end, the topic itself left out;
- ``oracle_hit1``: the expected Hit@1 of a ranker that follows exactly that path and picks one of its
  end nodes at random: the mean of hits / end nodes. A ranker that knows the relation path cannot do
  better unless something other than the path tells the end nodes apart.

These are the limits to read the Hit@1 and ceiling figures against. On MetaQA, ``kb.txt`` merges films
that share a title ("Little Women" carries the directors of three films) while each question's answers
come from one of them, so a 1-hop question's path can end at several nodes with only one answer.
Every step is vectorised over the questions (flat (question, node) arrays over the CSR).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from seeder.config import PriorConfig
from seeder.data.store import open_dataset
from seeder.retrieve.paths import decode, describe, golden_paths_batched, sampled_slices


def _all_slices(indptr: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR positions of every neighbour of ``nodes`` and the index of its node: ``sampled_slices`` with
    a cap no node reaches, so nothing is sampled away."""
    cap = int(np.diff(np.asarray(indptr)).max(initial=0)) or 1
    return sampled_slices(indptr, nodes, cap)


def follow(
    indptr: np.ndarray, neighbors: np.ndarray, relations: np.ndarray, start: np.ndarray, path: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Every node at the end of relation ``path`` from each question's ``start`` node (no caps):
    flat (question row, node), deduplicated."""
    q = np.flatnonzero(start >= 0)
    node = start[q].astype(np.int64)
    for rel in path:
        pos, owner = _all_slices(indptr, node)
        keep = np.asarray(relations[pos]) == rel
        q, node = q[owner[keep]], np.asarray(neighbors[pos[keep]], np.int64)
        key = np.unique(q * len(indptr) + node)
        q, node = key // len(indptr), key % len(indptr)
    return q, node


def reach_any(indptr: np.ndarray, neighbors: np.ndarray, start: np.ndarray, hops: np.ndarray) -> np.ndarray:
    """Flat (question row * N + node) keys of the nodes within ``hops[row]`` hops of each start."""
    n = len(indptr) - 1
    q = np.flatnonzero(start >= 0)
    seen = np.unique(q * n + start[q])
    frontier = seen
    for h in range(1, int(hops.max()) + 1):
        frontier = frontier[hops[frontier // n] >= h]  # questions of fewer hops are done
        pos, owner = _all_slices(indptr, frontier % n)
        keys = np.unique((frontier // n)[owner] * n + np.asarray(neighbors[pos], np.int64))
        frontier = np.setdiff1d(keys, seen, assume_unique=True)
        seen = np.union1d(seen, frontier)
    return seen


def answer_keys(answers: list, n: int) -> np.ndarray:
    lengths = np.array([len(a) for a in answers], np.int64)
    flat = np.concatenate([np.asarray(a, np.int64) for a in answers]) if len(answers) else np.zeros(0, np.int64)
    return np.unique(np.repeat(np.arange(len(answers)), lengths) * n + flat)


def type_paths(kg, queries, type_col: str, topic_col: str, per_type: int = 300) -> dict[str, int]:
    """Per question type, the path code that reaches an answer for the most training questions (the
    first ``per_type`` of each type; ties: fewer end nodes on average)."""
    train = queries[queries.split == "train"]
    train = train.groupby(type_col, group_keys=False).head(per_type).reset_index(drop=True)
    seeds = train[topic_col].fillna(-1).astype(np.int64).to_numpy()[:, None]
    lengths = train.answers.map(len).to_numpy()
    ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.concatenate(train.answers.map(lambda a: np.asarray(a, np.int64)).to_list())
    hops = int(train.hop.max()) if "hop" in train else 3
    paths = golden_paths_batched(kg, seeds, ptr, flat, hops, PriorConfig())
    frame = pd.DataFrame({"type": train[type_col].to_numpy()[paths["query"]], "code": paths["code"], "reached": paths["reached"]})
    score = frame.groupby(["type", "code"]).agg(questions=("code", "size"), reached=("reached", "mean")).reset_index()
    score = score.sort_values(["type", "questions", "reached"], ascending=[True, False, True])
    return dict(score.groupby("type").first()["code"].items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", required=True, help="an imported dataset directory (seeder import ...)")
    parser.add_argument("--split", default="val", help="split whose questions are scored")
    parser.add_argument("--type", default="qtype", help="query attribute with the question type")
    parser.add_argument("--topic", default="topic_id", help="query attribute with the topic entity's node id")
    args = parser.parse_args()

    kg = open_dataset(args.dataset)
    queries = kg.queries.to_pandas()
    for col in (args.type, args.topic, "hop"):
        if col not in queries.columns:
            sys.exit(
                f"bench_limits: {Path(args.dataset) / 'queries.parquet'} has no column {col!r} "
                f"(columns: {', '.join(queries.columns)}); pass --type/--topic"
            )
    codes = type_paths(kg, queries, args.type, args.topic)
    split = queries[queries.split == args.split].reset_index(drop=True)
    if split.empty:
        sys.exit(f"bench_limits: no questions in split {args.split!r}")
    n = kg.num_nodes
    indptr, neighbors, relations = kg.indptr, kg.neighbors, kg.edge_relations
    start = split[args.topic].fillna(-1).astype(np.int64).to_numpy()
    answers = answer_keys(split.answers.to_list(), n)
    hop = split.hop.to_numpy()

    any_hit = np.zeros(len(split), bool)
    any_hit[np.intersect1d(reach_any(indptr, neighbors, start, hop), answers) // n] = True

    reach_path = np.zeros(len(split), bool)
    path_nodes = np.zeros(len(split))
    oracle = np.zeros(len(split))
    names = kg.relation_names
    print("question-type paths (from the train split's golden paths):")
    for qtype, code in sorted(codes.items()):
        rows = np.flatnonzero(split[args.type].to_numpy() == qtype)
        if len(rows) == 0:
            continue
        print(f"  {qtype}: {describe(int(code), names)}")
        q, node = follow(indptr, neighbors, relations, start[rows], decode(int(code), 2 * kg.num_relations))
        not_topic = node != start[rows][q]  # a question's answer is never its own topic entity
        q, node = q[not_topic], node[not_topic]
        keys = rows[q] * n + node
        is_answer = np.isin(keys, answers)
        ends = np.bincount(q, minlength=len(rows))
        hits = np.bincount(q, weights=is_answer, minlength=len(rows))
        path_nodes[rows] = ends
        reach_path[rows] = hits > 0
        oracle[rows] = np.where(ends > 0, hits / np.maximum(ends, 1), 0.0)

    print(f"\n{args.split}: {len(split)} questions ({args.dataset})")
    print("| hop | questions | reach_any | reach_path | path_nodes | oracle_hit1 |")
    print("|---|---|---|---|---|---|")
    groups = [(f"hop={h}", hop == h) for h in np.unique(hop)] + [("all", np.ones(len(split), bool))]
    for name, mask in groups:
        print(
            f"| {name} | {int(mask.sum())} | {any_hit[mask].mean():.3f} | {reach_path[mask].mean():.3f} | "
            f"{path_nodes[mask].mean():.1f} | {oracle[mask].mean():.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
