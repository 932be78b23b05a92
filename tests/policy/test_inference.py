"""seeder/policy/inference.py: greedy ranking with a schedule given at inference time, and the evaluation
metrics training validates with."""

from dataclasses import replace

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


def test_the_prior_s_path_ends_join_by_default_and_validation_ranks_as_inference(trained):
    _, model_config, _ = trained
    assert Schedule.evaluation(load_config(None, []), model_config).prior_nodes == 5
    assert Schedule.training(load_config(None, ["eval.prior_nodes=3"])).prior_nodes == 3
    assert Schedule.evaluation(load_config(None, ["eval.prior_nodes=0"]), model_config).prior_nodes == 0
    with pytest.raises(ConfigError, match="eval.prior_nodes"):
        rank_with(trained, ["eval.prior_nodes=-1"])


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


def test_no_rollouts_is_todays_greedy_ranking_exactly(trained):
    """``eval.rollouts=0`` (the default) takes the greedy path unchanged: rankings, steps and scores."""
    model, config, data = trained
    greedy = retrieve(model, data, Schedule.training(config), 60)
    schedule, _ = rank_with(trained, ["eval.rollouts=0", "eval.fusion=votes", "eval.rollout_seed=5"])
    assert schedule.rollouts == 0
    voted = retrieve(model, data, schedule, 60)
    for got, expected in zip(voted, greedy):
        np.testing.assert_array_equal(getattr(got, "ranking", got), getattr(expected, "ranking", expected))
    np.testing.assert_array_equal(voted[0].set_size, greedy[0].set_size)


@pytest.mark.parametrize("fusion", ["rrf", "votes"])
def test_voted_rankings_are_reproducible_per_seed_and_keep_the_greedy_set(trained, fusion):
    """R sampled rollouts next to the greedy one: the same seed gives the same fused ranking, another
    seed another; the fused set is the union of the rollouts' sets, so it holds the greedy set, and its
    nodes are ranked first, by fused score, each reached at a step no later than greedy reached it."""
    model, _, data = trained
    greedy, greedy_steps, _ = retrieve(model, data, rank_with(trained, [])[0], 60)
    schedule, _ = rank_with(trained, ["eval.rollouts=4", f"eval.fusion={fusion}", "eval.rollout_seed=1"])
    assert (schedule.rollouts, schedule.fusion, schedule.seed, schedule.temperature) == (4, fusion, 1, 1.0)
    first, steps, scores = retrieve(model, data, schedule, 60, batch_size=8)
    again, again_steps, again_scores = retrieve(model, data, schedule, 60, batch_size=8)
    np.testing.assert_array_equal(first.ranking, again.ranking)
    np.testing.assert_array_equal(steps, again_steps)
    np.testing.assert_array_equal(scores, again_scores)
    other, _, _ = retrieve(model, data, replace(schedule, seed=2), 60, batch_size=8)
    assert not np.array_equal(other.ranking, first.ranking)  # the seed draws the samples
    assert (first.set_size >= greedy.set_size).all() and (first.set_size > greedy.set_size).any()
    for i in range(len(first.query_ids)):
        fused_set = first.ranking[i, : first.set_size[i]]
        greedy_set = greedy.ranking[i, : greedy.set_size[i]]
        assert set(greedy_set.tolist()) <= set(fused_set.tolist())
        assert (np.diff(scores[i, : first.set_size[i]]) <= 0).all()  # the set by fused score
        assert (steps[i, : first.set_size[i]] >= 0).all() and (steps[i, first.set_size[i] :] == -1).all()
        at = {node: step for node, step in zip(greedy.ranking[i], greedy_steps[i]) if step >= 0}
        assert all(step <= at[node] for node, step in zip(fused_set, steps[i]) if node in at)
        # Outside the set, every rollout ranks by filter score: the rest is greedy's rest, in greedy's order.
        rest = [n for n in greedy.ranking[i] if n >= 0 and n not in set(fused_set.tolist())]
        assert first.ranking[i, first.set_size[i] : first.set_size[i] + len(rest)].tolist() == rest


def test_reciprocal_rank_and_vote_fusion_on_a_hand_made_case():
    """Two queries of four node slots, three rollouts; the second query's last slot is padding."""
    from seeder.policy.inference import RRF_K, fuse_rankings

    selected = torch.tensor(
        [
            [[1, 1, 0, 0], [0, 1, 1, 0], [0, 1, 0, 1]],
            [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]],
        ],
        dtype=torch.bool,
    )
    ranks = torch.tensor(
        [
            [[0, 1, 2, 3], [2, 0, 1, 3], [2, 0, 3, 1]],
            [[0, 1, 2, 3], [0, 2, 1, 3], [1, 0, 2, 3]],
        ]
    )
    valid = torch.tensor([[True] * 4, [True, True, True, False]])
    rr = lambda *ranks: sum(1 / (RRF_K + r + 1) for r in ranks)  # noqa: E731

    in_set, fused = fuse_rankings(selected, ranks, valid, "rrf", length=4)
    assert in_set.tolist() == [[True, True, True, True], [True, True, False, False]]
    expected = [[rr(0, 2, 2), rr(1, 0, 0), rr(2, 1, 3), rr(3, 3, 1)], [rr(0, 0, 1), rr(1, 2, 0), rr(2, 1, 2), 0.0]]
    np.testing.assert_allclose(fused.numpy(), np.array(expected), rtol=1e-6)
    # Node 1 of query 0, first in two rollouts, leads; nodes 2 and 3 have the same sum of ranks, and
    # node 2's (2, 1, 3) beats node 3's (3, 3, 1) by 1/63 - 1/64.
    assert fused[0].argsort(descending=True).tolist() == [1, 0, 2, 3]

    # Only the first ``length`` ranks of a rollout count.
    _, short = fuse_rankings(selected, ranks, valid, "rrf", length=2)
    np.testing.assert_allclose(short[0].numpy(), [rr(0), rr(1, 0, 0), rr(1), rr(1)], rtol=1e-6)

    in_set, votes = fuse_rankings(selected, ranks, valid, "votes", length=4)
    counts = selected.sum(1).float()
    assert (votes.floor() == counts * valid).all()  # the integer part is the vote count
    most = 3 / (RRF_K + 1)
    np.testing.assert_allclose((votes - votes.floor()).numpy(), 0.5 * np.array(expected) / most, rtol=1e-5)
    assert votes[0].argsort(descending=True).tolist()[0] == 1  # three votes
    assert votes[1, 0] > votes[1, 1] > votes[1, 2]  # two votes, one, none
