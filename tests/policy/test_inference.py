"""seeder/policy/inference.py: greedy ranking with a schedule given at inference time, and the evaluation
metrics training validates with."""

import numpy as np
import pytest
import torch

from seeder.config import ConfigError, load_config
from seeder.policy.inference import QueryData, Schedule, evaluate, retrieve
from seeder.policy.toy import toy_task
from seeder.retrieve.metrics import per_query_metrics
from seeder.training.loop import build_state, epoch_queries, steps_per_epoch, train_epoch, trainable_queries

TRAINED_WITH = ["train.expansion_sizes=[3,3]", "train.frontier_caps=[8,10]", "model.hidden_dim=16", "model.num_layers=2"]


@pytest.fixture(scope="module")
def trained():
    data = toy_task(32, 30, 8, seed=0)
    config = load_config(None, [*TRAINED_WITH, "train.epochs=1", "train.warmup_epochs=0"])
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    train_epoch(state, data, np.arange(len(data.subgraphs)))
    return state.model, config, data


def rank_with(trained, overrides):
    model, model_config, data = trained
    schedule = Schedule.evaluation(load_config(None, overrides), model_config)
    return schedule, retrieve(model, data, schedule, 100)[0]


def test_the_model_retrieves_with_its_training_schedule_by_default(trained):
    schedule, result = rank_with(trained, [])
    assert schedule.expansion_sizes == (3, 3)
    assert result.set_size.max() == 3 + 3 + 3  # three seeds, then c_t = 3 and 3


def test_eval_schedule_overrides_the_training_one(trained):
    _, default = rank_with(trained, [])
    schedule, larger = rank_with(trained, ["eval.expansion_sizes=[3,6,4]", "eval.frontier_caps=[8,20,20]"])
    assert schedule.frontier_caps == (8, 20, 20)
    assert larger.set_size.max() == 3 + 3 + 6 + 4
    assert larger.set_size.mean() > default.set_size.mean()
    assert (larger.set_size >= default.set_size).all()  # a larger budget never shrinks a set


def test_a_schedule_whose_caps_do_not_match_is_refused(trained):
    with pytest.raises(ConfigError, match="eval.frontier_caps"):
        rank_with(trained, ["eval.expansion_sizes=[3,6,4]"])
    with pytest.raises(ConfigError, match="positive"):
        rank_with(trained, ["eval.expansion_sizes=[3,0]", "eval.frontier_caps=[8,8]"])


def test_batch_size_does_not_change_rankings(trained):
    model, config, data = trained
    schedule = Schedule.training(config)
    (one, one_steps, one_scores) = retrieve(model, data, schedule, 40, batch_size=1)
    (many, many_steps, many_scores) = retrieve(model, data, schedule, 40, batch_size=32)
    np.testing.assert_array_equal(one.ranking, many.ranking)
    np.testing.assert_array_equal(one_steps, many_steps)
    np.testing.assert_allclose(one_scores, many_scores, atol=1e-4)  # padding changes the summation order


def test_validation_metrics_are_the_evaluation_metrics(trained):
    model, config, data = trained
    result, means = evaluate(model, data, config)
    per_query = per_query_metrics(result, data.subgraphs.answer_ptr, data.subgraphs.answers, config.eval.ks)
    assert means == {k: float(v.mean()) for k, v in per_query.items()}


def test_epoch_queries_are_disjoint_equal_and_reseeded_per_epoch():
    pool = np.arange(103)
    shards = [epoch_queries(pool, 0, 0, rank, 4) for rank in range(4)]
    assert all(len(s) == 25 for s in shards)
    assert len(np.unique(np.concatenate(shards))) == 100
    assert not np.array_equal(epoch_queries(pool, 0, 1, 0, 4), shards[0])
    assert np.array_equal(epoch_queries(pool, 0, 0, 2, 4), shards[2])
    assert len(epoch_queries(pool, 0, 0, 1, 4, queries_per_epoch=40)) == 10
    # One worker trains on exactly the queries a Ray-free run trains on.
    assert np.array_equal(epoch_queries(pool, 3, 2, 0, 1), np.random.default_rng([3, 2]).permutation(pool))


def test_trainable_queries_leave_out_subgraphs_without_an_answer(trained):
    _, config, data = trained
    assert len(trainable_queries(data, config)) == len(data.subgraphs)  # the toy task puts one in every subgraph


def test_batches_gather_node_rows_from_a_tensor_as_from_the_array():
    # QueryData.on hands a GPU the node features as a tensor; batches then gather rows there. The
    # gather must give the rows the host path gives, in the same order (a CPU tensor runs that path).
    data = toy_task(24, 30, 16, num_relations=3, seed=2)
    index = np.array([5, 0, 17, 3])
    on_host = data.batch(index)
    as_tensor = QueryData(
        torch.from_numpy(data.node_features), data.relation_features, data.query_features, data.subgraphs
    ).batch(index)
    assert torch.equal(on_host.node_text, as_tensor.node_text)
    assert on_host.node_text.shape == (len(data.subgraphs.take(index).nodes), 16)
    assert data.on("cpu") is data  # nothing moves for a CPU


def test_node_features_stay_on_the_host_above_the_device_size_limit(monkeypatch):
    import seeder.policy.inference as inference

    data = toy_task(4, 10, 8, num_relations=2, seed=0)
    monkeypatch.setattr(inference, "DEVICE_FEATURES_MAX_BYTES", data.node_features.nbytes - 1)
    assert data.on("meta") is data  # too large: rows keep being gathered on the host
    monkeypatch.setattr(inference, "DEVICE_FEATURES_MAX_BYTES", data.node_features.nbytes)
    moved = data.on("meta")
    assert isinstance(moved.node_features, torch.Tensor) and moved.node_features.device.type == "meta"


def test_positions_in_rows_match_a_brute_force_comparison():
    """The column of each ranked id among its row's node ids (the first of repeats), as the [B, L, W]
    comparison it replaces gives it, padding (-1) never found."""
    from seeder.policy.inference import positions_in_rows

    rng = np.random.default_rng(0)
    for _ in range(200):
        rows, width, length = (int(x) for x in rng.integers(1, 12, 3))
        table, ids = rng.integers(-1, 8, (rows, width)), rng.integers(-1, 9, (rows, length))
        match = (ids[:, :, None] == table[:, None, :]) & (ids[:, :, None] >= 0)
        pos, found = positions_in_rows(table, ids)
        np.testing.assert_array_equal(found, match.any(2))
        np.testing.assert_array_equal(pos[found], match.argmax(2)[found])
    pos, found = positions_in_rows(np.full((2, 3), -1), np.full((2, 4), -1))
    assert not found.any() and pos.shape == (2, 4)


def test_several_graphs_concatenated_rank_each_query_as_its_own_graph_does(tmp_path):
    """``QueryData.concat`` (one model for several graphs): node, query and relation ids are offset per
    graph and each graph's relation rows keep their direction, so a query ranks exactly as in its own graph."""
    from seeder.policy.checkpoint import load_model
    from seeder.policy.inference import QueryData, evaluate
    from seeder.preprocessing.artifacts import open_artifacts
    from tests.datasets import hand_built_artifacts

    first, model_dir, _ = hand_built_artifacts(tmp_path / "a", "dense", relations=3, reduce_dim=0)
    second, _, _ = hand_built_artifacts(tmp_path / "b", "dense", relations=5, reduce_dim=0, seed=4)
    model, info = load_model(model_dir)
    parts = [QueryData.from_artifacts(open_artifacts(p), "val") for p in (first, second)]
    joined = QueryData.concat(parts)
    assert joined.num_relations == 8 and len(joined.subgraphs) == sum(len(p.subgraphs) for p in parts)
    together, _ = evaluate(model, joined, info.config)
    offset, start = len(parts[0].node_features), 0
    for g, part in enumerate(parts):
        alone, _ = evaluate(model, part, info.config)
        rows = slice(start, start + len(part.subgraphs))
        ranking = together.ranking[rows][:, : alone.ranking.shape[1]]
        expected = np.where(alone.ranking >= 0, alone.ranking + (offset if g else 0), -1)
        np.testing.assert_array_equal(ranking, expected)
        np.testing.assert_array_equal(together.set_size[rows], alone.set_size)
        start += len(part.subgraphs)
