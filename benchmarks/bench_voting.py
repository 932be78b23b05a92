"""Multi-rollout voting (ARK) against greedy inference, on a split's preprocessed questions:

    python benchmarks/bench_voting.py --model RUN/model [--artifacts ART] [--split val] \
        [--rollouts 0,4,8] [--fusion rrf] [--queries 0] [--rounds 2]

Each setting (R = 0 is greedy; R > 0 adds R sampled rollouts per question, ``eval.rollouts``) ranks the
same questions through ``seeder.policy.inference.retrieve`` on the artifacts' stored subgraphs, so the
latency is the policy's part of a question only (encoding, seeds and the K-hop expansion do not change
with R). The settings run in turns, ``--rounds`` times, after one warm-up pass, and each keeps its
fastest round: the latency ratio against greedy is measured in the same process and the same rounds.
Reported: Hit@1 overall and per hop (``--by``), Recall@20, MRR, the set size, and ms per question.
Figures only, nothing asserted.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory, runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts (default: the model's)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--rollouts", default="0,4,8", help="R values, comma separated (0: greedy)")
    parser.add_argument("--fusion", default="rrf", choices=["rrf", "votes"])
    parser.add_argument("--seed", type=int, default=0, help="eval.rollout_seed")
    parser.add_argument("--queries", type=int, default=0, help="a seeded sample of the split's questions (0: all)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per setting (the fastest is kept)")
    parser.add_argument("--by", default="hop", help="query attribute of the per-group Hit@1")
    parser.add_argument("--json", help="also write the table as JSON")
    args = parser.parse_args(argv)

    import torch

    from seeder import Retriever
    from seeder.policy.inference import QueryData, retrieve
    from seeder.retrieve.metrics import per_query_metrics

    retriever = Retriever.load(args.model, artifacts=args.artifacts)
    artifacts = retriever.artifacts
    subgraphs = artifacts.subgraphs(args.split)
    if args.queries and args.queries < len(subgraphs):
        subgraphs = subgraphs.take(np.sort(np.random.default_rng(0).permutation(len(subgraphs))[: args.queries]))
    rows = artifacts.query_rows(subgraphs.query_ids)
    data = QueryData(
        retriever.node_features,
        np.asarray(artifacts.relation_features, np.float32),
        np.asarray(artifacts.query_features[rows], np.float32),
        subgraphs,
    )
    queries = artifacts.dataset.queries_of(args.split)
    group_of = (
        dict(zip(queries.column("id").to_pylist(), queries.column(args.by).to_pylist()))
        if args.by in queries.column_names
        else {}
    )
    groups = np.array([str(group_of.get(int(q), "all")) for q in subgraphs.query_ids], dtype=object)
    settings = [int(r) for r in args.rollouts.split(",")]
    schedules = {r: replace(retriever.schedule, rollouts=r, fusion=args.fusion, seed=args.seed) for r in settings}
    print(
        f"{len(subgraphs):,} {args.split} questions, schedule {list(retriever.schedule.expansion_sizes)} / "
        f"{list(retriever.schedule.frontier_caps)}, fusion {args.fusion}, batch {retriever.batch_size}, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )

    def run(r: int):
        start = time.perf_counter()
        result, _, _ = retrieve(retriever.model, data, schedules[r], retriever.ranking_length, retriever.batch_size)
        return result, time.perf_counter() - start

    run(settings[0])  # warm-up: first-call allocations and caches
    seconds = {r: float("inf") for r in settings}
    results = {}
    for round_ in range(args.rounds):
        for r in settings:
            result, took = run(r)
            seconds[r] = min(seconds[r], took)
            if r in results:
                assert np.array_equal(results[r].ranking, result.ranking), "a fixed seed must rank the same way"
            results[r] = result
            print(f"  round {round_ + 1} R={r}: {took:.1f} s", flush=True)

    table = []
    for r in settings:
        metrics = per_query_metrics(results[r], subgraphs.answer_ptr, subgraphs.answers, [1, 5, 20])
        row = {
            "rollouts": r,
            "hit_at_1": float(metrics["hit_at_1"].mean()),
            "recall_at_20": float(metrics["recall_at_20"].mean()),
            "mrr": float(metrics["mrr"].mean()),
            "set_size": float(results[r].set_size.mean()),
            "ms_per_question": 1000 * seconds[r] / len(subgraphs),
            "latency_vs_greedy": seconds[r] / seconds[settings[0]],
            "hit_at_1_by": {g: float(metrics["hit_at_1"][groups == g].mean()) for g in sorted(set(groups))},
        }
        table.append(row)
    by = sorted(table[0]["hit_at_1_by"])
    header = ["setting", "Hit@1", *[f"Hit@1 {args.by}={g}" for g in by], "Recall@20", "MRR", "set", "ms/q", f"x R={settings[0]}"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in table:
        name = "greedy" if row["rollouts"] == 0 else f"R={row['rollouts']} {args.fusion}"
        cells = [
            name,
            f"{row['hit_at_1']:.4f}",
            *[f"{row['hit_at_1_by'][g]:.4f}" for g in by],
            f"{row['recall_at_20']:.4f}",
            f"{row['mrr']:.4f}",
            f"{row['set_size']:.1f}",
            f"{row['ms_per_question']:.2f}",
            f"{row['latency_vs_greedy']:.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"questions": len(subgraphs), "split": args.split, "fusion": args.fusion, "rows": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
