"""benchmarks/bench_expand.py: both graphs are timed in turn, and the figures come from each one's best run."""

from __future__ import annotations

import re
import sys

from tests.benchmarks import load_script


def test_the_graphs_take_turns_and_the_best_run_of_each_is_reported(monkeypatch, capsys):
    bench = load_script("bench_expand")
    order = []
    run = bench.Workload.run
    monkeypatch.setattr(bench.Workload, "run", lambda self: (order.append(self.label), run(self)))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_expand.py",
            "--nodes",
            "20000",
            "--edges",
            "200000",
            "--small-nodes",
            "5000",
            "--hub-degree",
            "2000",
            "--queries",
            "60",
            "--repeats",
            "3",
        ],
    )
    bench.main()
    assert order == ["small", "large"] * 3
    out = capsys.readouterr().out
    for label in ("small", "large"):
        line = next(row for row in out.splitlines() if row.startswith(label + " "))
        rate = int(re.search(r"(\d+) subgraphs/s/core", line).group(1))
        runs = [int(r) for r in re.search(r"runs ([\d, ]+)\)", line).group(1).split(", ")]
        assert len(runs) == 3 and rate == max(runs)
    assert "subgraphs/s/core at N=20,000:" in out and "per-query cost N=20,000 / N=5,000:" in out
