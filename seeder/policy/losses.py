"""Training losses (paper, Algorithm 2 and Appendix D.3-D.6): group-baselined REINFORCE + BPR."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seeder.config import Baseline, ConfigError, choices

BASELINES = choices(Baseline)


def advantages(rewards: torch.Tensor, baseline: str, greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages of M sampled trajectories per query. rewards [B, M].

    ``group_mean``: reward minus the mean of its query's group (the paper's default; sums to zero per
    query); ``none``: the raw reward (ablation "no baseline"); ``greedy``: reward minus the reward of the
    query's greedy trajectory, ``greedy_rewards`` [B] (ablation "greedy-decoding baseline", self-critical).
    """
    if baseline == "group_mean":
        return rewards - rewards.mean(dim=1, keepdim=True)
    if baseline == "none":
        return rewards
    if baseline == "greedy":
        if greedy_rewards is None:
            raise ValueError("the greedy baseline needs the greedy trajectory's rewards")
        return rewards - greedy_rewards.unsqueeze(1)
    raise ConfigError(f"train.baseline={baseline!r}: use one of {', '.join(BASELINES)}")


def reinforce_loss(log_probs: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Score-function loss: -E[A * log p(trajectory)], averaged over all trajectories."""
    return -(advantage.detach() * log_probs).mean()


def bpr_loss(scores: torch.Tensor, in_set: torch.Tensor, is_answer: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """BPR over the final set of every trajectory: every (answer, non-answer) pair inside the set.

    scores, in_set, is_answer: [G, P]. Per pair ``softplus(margin - (s_a - s_n))`` =
    ``-log sigmoid(s_a - s_n - margin)`` (margin 0 is plain BPR; the paper's variant uses 0.5). Each
    trajectory's pairs are averaged, then trajectories with at least one pair are averaged; zero when no
    trajectory has a pair.
    """
    # Compact each row to its set members (members first), so pairs are [G, S, S] with S = max set size.
    size = int(in_set.sum(1).max()) if in_set.numel() else 0
    if size == 0:
        return scores.sum() * 0.0
    order = torch.argsort((~in_set).to(torch.int8), dim=1, stable=True)[:, :size]
    member = in_set.gather(1, order)
    s = scores.gather(1, order)
    positive = member & is_answer.gather(1, order)
    negative = member & ~is_answer.gather(1, order)
    pair = positive.unsqueeze(2) & negative.unsqueeze(1)  # [G, S, S]
    losses = F.softplus(margin - (s.unsqueeze(2) - s.unsqueeze(1)))
    pairs_per_row = pair.sum((1, 2))
    per_row = (losses * pair).sum((1, 2)) / pairs_per_row.clamp_min(1)
    has_pairs = pairs_per_row > 0
    if not has_pairs.any():
        return scores.sum() * 0.0
    return per_row[has_pairs].mean()
