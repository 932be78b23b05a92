"""Batched rollouts: Plackett-Luce log-probabilities, masking, frontiers, deterministic full rankings."""

import itertools
import math
from dataclasses import replace

import numpy as np
import torch

from seeder.config import load_config
from seeder.policy.inference import Schedule, retrieve
from seeder.policy.model import SeedERPolicy
from seeder.policy.rollout import NEG, Rollout, plackett_luce_log_prob, rank_nodes, sample_top_k
from seeder.policy.toy import toy_task
from seeder.retrieve.prior import OFF_PATH_TERM


def exact_ordered_probability(logits: list[float], order: tuple[int, ...]) -> float:
    remaining = list(range(len(logits)))
    p = 1.0
    for pick in order:
        p *= math.exp(logits[pick]) / sum(math.exp(logits[j]) for j in remaining)
        remaining.remove(pick)
    return p


def test_plackett_luce_log_prob_matches_the_exact_formula():
    logits = [0.3, -1.0, 1.2, 0.0]
    orders = list(itertools.permutations(range(4), 2))
    picks = torch.tensor(orders)
    lp = plackett_luce_log_prob(torch.tensor([logits] * len(orders)), picks, torch.ones_like(picks, dtype=torch.bool))
    exact = torch.tensor([math.log(exact_ordered_probability(logits, o)) for o in orders])
    torch.testing.assert_close(lp, exact, rtol=1e-5, atol=1e-6)
    assert math.isclose(float(lp.exp().sum()), 1.0, rel_tol=1e-5)


def test_plackett_luce_log_prob_with_absent_candidates_uncounted_picks_and_wide_logits():
    """Candidates at NEG are absent, a pick that is not ok is no pick (its candidate stays in later
    normalisers), a row may have no candidate at all; logits up to +-1000 stay exact and finite."""
    generator = torch.Generator().manual_seed(0)
    for scale in (1.0, 1000.0):
        logits = torch.randn(6, 9, generator=generator, dtype=torch.float64) * scale
        available = torch.rand(6, 9, generator=generator) > 0.3
        available[0] = False
        logits = logits.masked_fill(~available, NEG)
        picks = torch.stack([torch.randperm(9, generator=generator)[:5] for _ in range(6)])
        pick_ok = available.gather(1, picks) & (torch.rand(6, 5, generator=generator) > 0.2)
        expected = []
        for row in range(6):
            remaining = set(range(9))
            total = 0.0
            for pick, ok in zip(picks[row].tolist(), pick_ok[row].tolist()):
                if ok:
                    values = [float(logits[row, j]) for j in remaining]
                    top = max(values)
                    total += float(logits[row, pick]) - (top + math.log(sum(math.exp(v - top) for v in values)))
                    remaining.remove(pick)
            expected.append(total)
        leaf = logits.clone().requires_grad_()
        got = plackett_luce_log_prob(leaf, picks, pick_ok)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9)
        assert got[0] == 0.0
        got.sum().backward()
        assert torch.isfinite(leaf.grad).all() and (leaf.grad[~available] == 0).all()


def test_gumbel_top_k_samples_follow_plackett_luce():
    logits = torch.tensor([0.3, -1.0, 1.2, 0.0, 0.5])
    available = torch.tensor([True, True, True, True, False])  # the last candidate is masked
    n = 40_000
    picks, ok, lp = sample_top_k(
        logits.expand(n, 5),
        available.expand(n, 5),
        2,
        torch.zeros(n, dtype=torch.bool),
        1.0,
        torch.Generator().manual_seed(0),
    )
    assert ok.all() and not (picks == 4).any()
    counts = {}
    for a, b in picks.tolist():
        counts[(a, b)] = counts.get((a, b), 0) + 1
    for order in itertools.permutations(range(4), 2):
        exact = exact_ordered_probability(logits[:4].tolist(), order)
        assert abs(counts.get(order, 0) / n - exact) < 4 * math.sqrt(exact * (1 - exact) / n) + 1e-3
    # The log-probability returned with each sample is that sample's exact probability.
    first = tuple(picks[0].tolist())
    assert math.isclose(float(lp[0].exp()), exact_ordered_probability(logits[:4].tolist(), first), rel_tol=1e-4)


def test_temperature_flattens_sampling_and_greedy_takes_the_top():
    logits = torch.tensor([[2.0, 0.0, -2.0]])
    picks, _, _ = sample_top_k(logits, torch.ones(1, 3, dtype=torch.bool), 2, torch.ones(1, dtype=torch.bool), 1.0, None)
    assert picks.tolist() == [[0, 1]]
    n = 20_000
    hot, _, _ = sample_top_k(
        logits.expand(n, 3),
        torch.ones(n, 3, dtype=torch.bool),
        1,
        torch.zeros(n, dtype=torch.bool),
        100.0,
        torch.Generator().manual_seed(1),
    )
    assert abs((hot == 2).float().mean().item() - 1 / 3) < 0.03  # near uniform at high temperature


def test_an_all_greedy_rollout_picks_the_top_without_noise_or_log_prob():
    """``greedy=True`` (inference) picks what an all-greedy mask picks, and draws no random numbers."""
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    available = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    mask_picks, mask_ok, _ = sample_top_k(logits, available, 3, torch.ones(5, dtype=torch.bool), 1.0, None)
    state = torch.get_rng_state()
    picks, ok, log_prob = sample_top_k(logits, available, 3, True, 1.0, None)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(ok, mask_ok) and torch.equal(picks[ok], mask_picks[mask_ok])
    assert torch.equal(log_prob, torch.zeros(5))


def small_setup(num_queries=6, copies=3):
    data = toy_task(num_queries, 24, 8, seed=3)
    config = load_config(None, ["train.expansion_sizes=[3,4]", "train.frontier_caps=[6,8]", "model.hidden_dim=16"])
    torch.manual_seed(0)
    model = SeedERPolicy(8, config.model)
    batch = data.batch(np.arange(num_queries))
    return data, config, model, batch, Rollout(model, batch, torch.from_numpy(data.relation_features), copies)


def test_frontier_is_the_neighbourhood_of_the_selected_set_minus_it():
    data, _, _, batch, rollout = small_setup()
    selected = rollout.expand(batch.is_seed)
    index, ok = rollout.frontier(selected, cap=100)
    sg = data.subgraphs
    for g in range(rollout.num_copies):
        q = g // rollout.copies
        lo, hi = sg.edge_ptr[q], sg.edge_ptr[q + 1]
        src, dst = sg.edge_src[lo:hi], sg.edge_dst[lo:hi]
        sel = set(np.flatnonzero(selected[g].numpy()))
        expected = {int(d) for s, d in zip(src, dst) if s in sel} | {int(s) for s, d in zip(src, dst) if d in sel}
        assert set(index[g][ok[g]].tolist()) == expected - sel


def test_rollout_adds_distinct_unselected_nodes_each_step():
    _, config, _, batch, rollout = small_setup()
    out = rollout.run([3, 4], [6, 8], torch.zeros(rollout.num_copies, dtype=torch.bool), 1.0, torch.Generator().manual_seed(0))
    seeds = rollout.expand(batch.is_seed)
    assert (out.selected >= seeds).all()  # seeds stay
    assert ((out.reached_at == 0) == seeds).all()
    # toy frontiers are large enough: exactly c_t new nodes per step, never a node twice
    assert ((out.reached_at == 1).sum(1) == 3).all() and ((out.reached_at == 2).sum(1) == 4).all()
    assert (out.selected.sum(1) == 3 + 3 + 4).all()
    assert ((out.reached_at >= 0) == out.selected).all()
    assert torch.isfinite(out.log_prob).all() and (out.log_prob < 0).all()
    assert (out.scores[out.selected] > -1e8).all() and (out.scores[~out.selected] <= -1e8).all()


def with_path_ends(data, ends: dict[tuple[int, int], float]):
    """``data`` with every node off the prior's paths but ``ends``: (query, local node) -> path_end."""
    path_end = np.full(len(data.subgraphs.nodes), OFF_PATH_TERM, np.float32)
    for (q, i), value in ends.items():
        path_end[data.subgraphs.node_ptr[q] + i] = value
    return replace(data, subgraphs=replace(data.subgraphs, path_end=path_end))


def test_the_prior_s_best_path_ends_join_by_path_end_then_filter_score():
    data, config, model, _, _ = small_setup()
    # Query 0: two tied path ends (the filter score breaks the tie), a worse one, and a seed on a path;
    # query 1: one path end only, fewer than asked for; the other queries: none.
    data = with_path_ends(data, {(0, 10): -0.5, (0, 11): -0.5, (0, 12): -1.0, (0, 0): 0.0, (1, 20): -3.0})
    batch = data.batch(np.arange(6))
    rollout = Rollout(model, batch, torch.from_numpy(data.relation_features), 1)
    seeds = batch.is_seed.clone()
    score = batch.filter_score
    tie_winner = 10 if score[0, 10] > score[0, 11] else 11
    joined = rollout.join_prior_ends(seeds, 1)
    assert joined[0].nonzero().flatten().tolist() == [tie_winner]
    assert joined[1].nonzero().flatten().tolist() == [20]
    assert not joined[2:].any()
    joined = rollout.join_prior_ends(seeds, 5)
    assert joined[0].nonzero().flatten().tolist() == [10, 11, 12]  # the seed is selected already
    assert not (joined & seeds).any()


def test_joined_path_ends_enter_the_final_set_as_the_last_step_s_nodes():
    data, config, model, _, _ = small_setup()
    data = with_path_ends(data, {(q, 20 + q % 3): -0.1 for q in range(6)})
    plain, plain_steps, _ = retrieve(model, data, Schedule.training(config), 30)
    schedule = replace(Schedule.training(config), prior_nodes=2)
    joined, steps, _ = retrieve(model, data, schedule, 30)
    for q in range(6):
        node = int(data.subgraphs.nodes[data.subgraphs.node_ptr[q] + 20 + q % 3])
        in_plain = node in plain.ranking[q, : plain.set_size[q]]
        assert node in joined.ranking[q, : joined.set_size[q]]
        assert joined.set_size[q] == plain.set_size[q] + (0 if in_plain else 1)  # one path end per query
        if not in_plain:
            assert steps[q][joined.ranking[q] == node].item() == len(schedule.expansion_sizes)  # the last step's
    # With no path end anywhere (the cosine filter) nothing joins.
    cosine = replace(data, subgraphs=replace(data.subgraphs, path_end=np.zeros_like(data.subgraphs.path_end)))
    np.testing.assert_array_equal(retrieve(model, cosine, schedule, 30)[0].set_size, 10)


def test_evaluation_is_deterministic_and_rankings_are_full_without_duplicates():
    data, config, model, _, _ = small_setup()
    model.train()  # retrieve must switch dropout off itself
    first, steps, scores = retrieve(model, data, Schedule.training(config), 30)
    second, _, _ = retrieve(model, data, Schedule.training(config), 30)
    assert np.array_equal(first.ranking, second.ranking)
    assert (first.set_size == 10).all()
    for q in range(len(data.subgraphs)):
        row = first.ranking[q]
        ids = row[row >= 0]
        assert len(ids) == len(set(ids.tolist())) == 24  # every subgraph node, once
        nodes = set(data.subgraphs.nodes[data.subgraphs.node_ptr[q] : data.subgraphs.node_ptr[q + 1]].tolist())
        assert set(ids.tolist()) == nodes
        assert (row[24:] == -1).all()
        assert (steps[q, :10] >= 0).all() and (steps[q, 10:24] == -1).all()
        assert (np.diff(scores[q, :10]) <= 0).all()  # the set comes by model score, best first


def test_rank_nodes_orders_the_set_then_filter_score_then_node_id():
    data = toy_task(1, 9, 4, seed=0)
    batch = data.batch(np.arange(1))
    batch.filter_score[:] = torch.tensor([[0.5, 0.5, 0.5, 0.9, 0.1, 0.1, 0.1, 0.7, 0.2]])
    in_set = torch.zeros(1, 9, dtype=torch.bool)
    in_set[0, [1, 4, 6]] = True
    scores = torch.full((1, 9), -1e9)
    scores[0, [1, 4, 6]] = torch.tensor([0.2, 3.0, 0.2])
    result = rank_nodes(batch, in_set, scores, 12)
    assert result.ranking[0].tolist() == [4, 1, 6, 3, 7, 0, 2, 8, 5, -1, -1, -1]
    assert result.set_size.tolist() == [3]
