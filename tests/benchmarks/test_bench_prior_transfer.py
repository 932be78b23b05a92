"""benchmarks/bench_prior_transfer.py: the fine-tuned reader learns each question's path from its words,
and a path whose first relation the seeds lack is never its top path (the prior's profile mask)."""

from __future__ import annotations

import numpy as np

from seeder.features.embed import minilm_path
from seeder.retrieve.paths import path_digits
from seeder.retrieve.prior import all_paths
from tests.benchmarks import load_script


def test_the_finetuned_reader_learns_paths_and_keeps_the_profile_mask():
    bench = load_script("bench_prior_transfer")
    num_ids = 4  # two relations, both directions
    vocab = all_paths(num_ids, 2)
    code = {(0,): num_ids + 0, (1, 2): (num_ids + 1) * num_ids + 2, (3,): num_ids + 3}
    texts = ["who directed the movie", "what genre are the films written by the person", "when was the movie released"]
    paths = [(0,), (1, 2), (3,)]
    targets = np.zeros((3, len(vocab)), np.float32)
    targets[np.arange(3), np.searchsorted(vocab, [code[p] for p in paths])] = 1.0
    everything = np.ones((3, num_ids), np.float32)
    # The first question again, from seeds with no edge of relation 0: its learnt path cannot start there.
    judged_profile = np.vstack([everything, [[0, 1, 1, 1]]]).astype(np.float32)
    epochs = bench.finetuned_top_paths(
        minilm_path(),
        texts,
        everything,
        targets,
        np.ones(3),
        [*texts, texts[0]],
        judged_profile,
        vocab,
        epochs=12,
        lr=3e-4,
        seed=0,
    )
    *_, (last_epoch, top) = epochs
    assert last_epoch == 12
    assert top[:3].tolist() == [code[p] for p in paths]
    assert path_digits(top[3:], num_ids)[0, 0] != 0
