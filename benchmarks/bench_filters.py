"""What a query-time filter costs: the same questions ranked with and without ``types=`` / ``where=``.

    python benchmarks/bench_filters.py --model runs/demo/model/model [--split val] [--questions 200]

In one process, on the text of a split's questions: calls of ``--batch`` questions, and calls of one
question, each timed without a filter and with a type filter (the most frequent node type of the
graph, so that the filter keeps many nodes) in alternating blocks of ``--repeats`` calls, so that both
see the same machine. Prints the median seconds per call of each and their ratio (filtered /
unfiltered); the first filtered call, which builds the filter's node mask, is timed apart.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory, runs:/ID/model or models:/NAME@ALIAS")
    parser.add_argument("--artifacts", help="artifacts (default: the model's)")
    parser.add_argument("--split", default="val", help="the split whose question texts are ranked")
    parser.add_argument("--questions", type=int, default=200, help="questions of the split to use")
    parser.add_argument("--batch", type=int, default=64, help="questions per batched call")
    parser.add_argument("--repeats", type=int, default=5, help="calls per block; blocks alternate")
    parser.add_argument("--rounds", type=int, default=4, help="blocks of each kind")
    parser.add_argument("-k", type=int, default=20, help="nodes per question")
    args = parser.parse_args(argv)

    from seeder import Retriever

    retriever = Retriever.load(args.model, artifacts=args.artifacts)
    kg = retriever.artifacts.dataset
    questions = kg.queries_of(args.split).column("text").to_pylist()[: args.questions]
    kind, _ = Counter(kg.nodes.column("type").to_pylist()).most_common(1)[0]
    retriever.warm_up()
    first = timed(lambda: retriever.retrieve(questions[:1], k=args.k, types=[kind]))
    print(f"filter types=[{kind!r}]: its node mask built with the first call in {first * 1000:.1f} ms")
    for name, batch in (("one question", questions[:1]), (f"{args.batch} questions", questions[: args.batch])):
        plain, filtered = [], []
        for _ in range(args.rounds):
            plain += [timed(lambda: retriever.retrieve(batch, k=args.k)) for _ in range(args.repeats)]
            filtered += [timed(lambda: retriever.retrieve(batch, k=args.k, types=[kind])) for _ in range(args.repeats)]
        a, b = statistics.median(plain), statistics.median(filtered)
        print(f"{name}: unfiltered {a * 1000:.2f} ms, filtered {b * 1000:.2f} ms per call; ratio {b / a:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
