"""benchmarks/bench_train.py: the sample file that lets a GPU machine time training without the
artifacts must give the batches the artifacts give (node rows to float16 rounding)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from seeder.policy.toy import toy_task
from tests.benchmarks import load_script


def test_a_saved_sample_gives_the_same_batches(tmp_path):
    bench = load_script("bench_train")
    data = toy_task(40, 25, 16, num_relations=3, seed=4)
    index = np.array([31, 2, 17, 8, 9])
    path = tmp_path / "sample.npz"
    bench.save_sample(data, index, str(path))
    sample = bench.load_sample(str(path))
    assert len(sample.subgraphs) == len(index)
    original, saved = data.batch(index), sample.batch(np.arange(len(index)))
    torch.testing.assert_close(saved.node_text, original.node_text, atol=1e-3, rtol=0)
    for name in ("valid", "is_seed", "is_answer", "filter_score", "edge_src", "edge_dst", "edge_type", "query_features"):
        assert torch.equal(getattr(saved, name), getattr(original, name)), name
    # Node ids are renumbered, but the same node keeps one id within the sample and answers follow it.
    ids_before = original.global_nodes[original.valid].numpy()
    ids_after = saved.global_nodes[saved.valid].numpy()
    assert len(np.unique(ids_before)) == len(np.unique(ids_after))
    pairs = np.unique(np.stack([ids_before, ids_after]), axis=1)
    assert len(np.unique(pairs[0])) == pairs.shape[1] == len(np.unique(pairs[1]))


def test_the_benchmark_runs_on_a_sample_and_prints_each_batch_size(tmp_path, monkeypatch, capsys):
    bench = load_script("bench_train")
    path = tmp_path / "sample.npz"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_train.py",
            "--nodes",
            "40",
            "--steps",
            "1",
            "--batch-sizes",
            "4",
            "--sample-queries",
            "12",
            "--save-sample",
            str(path),
        ],
    )
    bench.main()
    assert "wrote 12 queries" in capsys.readouterr().out
    monkeypatch.setattr(
        sys, "argv", ["bench_train.py", "--sample", str(path), "--steps", "2", "--batch-sizes", "4,8", "--reference-queries", "1"]
    )
    bench.main()
    out = capsys.readouterr().out
    assert "batch_size=4:" in out and "batch_size=8:" in out and "reference:" in out
