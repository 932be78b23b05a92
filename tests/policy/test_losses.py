"""REINFORCE advantages and the BPR ranking loss."""

import math

import pytest
import torch

from seeder.config import ConfigError
from seeder.policy.losses import advantages, bpr_loss, reinforce_loss


def test_group_mean_advantages_sum_to_zero_per_query():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2], [0.0, 1.0, 0.0, 0.0]])
    adv = advantages(rewards, "group_mean")
    torch.testing.assert_close(adv.sum(1), torch.zeros(3))
    torch.testing.assert_close(adv[0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert (adv[1] == 0).all()


def test_greedy_and_no_baseline_variants():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.25]])
    torch.testing.assert_close(advantages(rewards, "greedy", torch.tensor([0.5, 0.5])), torch.tensor([[0.5, -0.5], [0.0, -0.25]]))
    torch.testing.assert_close(advantages(rewards, "none"), rewards)
    with pytest.raises(ValueError, match="greedy"):
        advantages(rewards, "greedy")
    with pytest.raises(ConfigError, match="baseline"):
        advantages(rewards, "median")


def test_reinforce_gradient_pushes_up_better_trajectories():
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = reinforce_loss(log_probs, torch.tensor([[0.5, -0.5]]))
    loss.backward()
    assert log_probs.grad[0, 0] < 0 < log_probs.grad[0, 1]  # descent raises the good one, lowers the bad


def test_bpr_on_a_hand_case():
    # Row 0: set {0, 1, 2}, answer 0 and 2, non-answer 1; node 3 is outside the set (ignored).
    # Row 1: set {0, 1}, no answer in the set: no pair, row ignored.
    scores = torch.tensor([[2.0, 0.0, -1.0, 5.0], [1.0, 0.0, -1e9, -1e9]])
    in_set = torch.tensor([[True, True, True, False], [True, True, False, False]])
    is_answer = torch.tensor([[True, False, True, False], [False, False, True, False]])
    plain = bpr_loss(scores, in_set, is_answer)
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))) / 2
    assert math.isclose(float(plain), expected, rel_tol=1e-6)
    margin = bpr_loss(scores, in_set, is_answer, margin=0.5)
    expected_margin = (math.log1p(math.exp(0.5 - 2.0)) + math.log1p(math.exp(0.5 + 1.0))) / 2
    assert math.isclose(float(margin), expected_margin, rel_tol=1e-6)


def test_bpr_without_pairs_is_zero_with_a_gradient_path():
    scores = torch.zeros(2, 3, requires_grad=True)
    loss = bpr_loss(scores, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool))
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert (scores.grad == 0).all()
