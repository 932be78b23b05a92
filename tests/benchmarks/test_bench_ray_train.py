"""benchmarks/bench_ray_train.py: the per-core ratio of each round and their median, the figure it
reads from bench_train.py, and a failed command's log."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmarks import load_script


def test_each_round_compares_its_epochs_mean_with_its_process_and_the_median_counts():
    bench = load_script("bench_ray_train")
    median, ratios = bench.summary([([700.0, 740.0], 750.0), ([600.0, 640.0], 600.0), ([800.0], 700.0)])
    assert ratios == pytest.approx([0.96, 620 / 600, 800 / 700])
    assert median == pytest.approx(620 / 600)


def test_bench_train_writes_the_figure_it_prints(tmp_path, monkeypatch, capsys):
    bench = load_script("bench_train")
    path = tmp_path / "figures.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_train.py",
            "--nodes",
            "40",
            "--steps",
            "2",
            "--batch-sizes",
            "4,8",
            "--reference-queries",
            "0",
            "--threads",
            "1",
            "--json",
            str(path),
        ],
    )
    bench.main()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("batched:")]
    figures = json.loads(path.read_text())
    assert figures["batch_sizes"] == [4, 8] and figures["threads"] == 1
    assert [f"{rate:.0f} trajectories/s" in line for rate, line in zip(figures["trajectories_per_second"], printed)] == [
        True,
        True,
    ]


def test_a_failed_command_stops_the_benchmark_and_names_its_log(tmp_path):
    bench = load_script("bench_ray_train")
    log = tmp_path / "round1_ray.log"
    with pytest.raises(SystemExit, match="exited with 3") as failure:
        bench.run_logged([sys.executable, "-c", "import sys; print('no artifacts here'); sys.exit(3)"], log)
    assert str(log) in str(failure.value) and "no artifacts here" in str(failure.value)
