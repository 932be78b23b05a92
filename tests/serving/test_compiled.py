"""seeder/serving/compiled.py: the policy and the question encoder through torch.compile, with an eager fallback."""

import copy
import warnings

import numpy as np
import pytest
import torch

from seeder.config import load_config
from seeder.policy.inference import Schedule, retrieve
from seeder.policy.toy import toy_task
from seeder.serving.compiled import POLICY_METHODS, CompiledOrEager, compile_encoder, compile_policy
from seeder.training.loop import build_state, steps_per_epoch, train_epoch


def double(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def broken(*args):
    raise RuntimeError("no C++ compiler\nmore detail")


def test_a_failed_compile_warns_once_and_runs_eagerly():
    piece = CompiledOrEager("double", double)
    piece.compiled = broken
    with pytest.warns(UserWarning, match=r"torch.compile of double failed \(RuntimeError: no C\+\+ compiler\)"):
        assert torch.equal(piece(torch.ones(3)), torch.full((3,), 2.0))
    assert piece.compiled is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert torch.equal(piece(torch.ones(3)), torch.full((3,), 2.0))


def test_tensors_of_fewer_than_two_rows_run_eagerly():
    piece = CompiledOrEager("double", double, lambda args: args[0].shape[0] < 2)
    piece.compiled = broken
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(piece(torch.ones(1, 4)), torch.full((1, 4), 2.0))
    with pytest.warns(UserWarning):
        piece(torch.ones(2, 4))


@pytest.mark.slow
@pytest.mark.parametrize("release_gil", [False, True], ids=["python-wrapper", "cpp-wrapper"])
def test_the_compiled_policy_ranks_like_the_eager_one(release_gil):
    data = toy_task(32, 30, 8, seed=0)
    config = load_config(
        None,
        [
            "train.expansion_sizes=[3,3]",
            "train.frontier_caps=[8,10]",
            "model.hidden_dim=16",
            "model.num_layers=2",
            "train.epochs=1",
            "train.warmup_epochs=0",
        ],
    )
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    train_epoch(state, data, np.arange(len(data.subgraphs)))
    eager = state.model.eval()
    compiled = compile_policy(copy.deepcopy(eager), release_gil=release_gil)
    schedule = Schedule.training(config)
    want, want_steps, want_scores = retrieve(eager, data, schedule, 40, batch_size=16)
    got, got_steps, got_scores = retrieve(compiled, data, schedule, 40, batch_size=16)
    assert all(getattr(compiled, name).compiled is not None for name in POLICY_METHODS)  # none fell back
    np.testing.assert_array_equal(got.ranking, want.ranking)
    np.testing.assert_array_equal(got_steps, want_steps)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-4)


@pytest.mark.slow
def test_the_compiled_int8_encoder_matches_the_eager_one_and_a_batch_of_equal_lengths_needs_no_graph_of_its_own():
    """The graphs compiled for a padded batch and a lone question serve a batch of equal lengths too (a
    serving replica sees one whenever questions of the same length arrive together). One compiled
    encoder for both checks: its compilation is most of the test's time."""
    from torch._dynamo.utils import counters

    from seeder.features.bert import BertSentenceEncoder
    from seeder.features.embed import minilm_path

    texts = ["what films did Joel Zwick direct", "who starred in the films written by the writer of Heat", "genre of Alien"]
    eager = BertSentenceEncoder(minilm_path(), cpu_precision="int8")
    compiled = compile_encoder(BertSentenceEncoder(minilm_path(), cpu_precision="int8"))
    assert isinstance(compiled._forward, CompiledOrEager)
    # Padded (two questions), then alone: the batch of three below has a size and a length not seen yet.
    got = np.concatenate([compiled.encode(texts[:2]), *(compiled.encode([t]) for t in texts)])
    want = np.concatenate([eager.encode(texts[:2]), *(eager.encode([t]) for t in texts)])
    assert compiled._forward.compiled is not None
    assert (got * want).sum(1).min() > 0.99  # int8 rounding may land on the other side of a step

    graphs = counters["stats"]["unique_graphs"]
    same_length = ["genre of Alien", "genre of Heat", "genre of Alien"]
    got = compiled.encode(same_length)
    assert counters["stats"]["unique_graphs"] == graphs
    assert compiled._forward.compiled is not None
    assert (got * eager.encode(same_length)).sum(1).min() > 0.99
