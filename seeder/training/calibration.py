"""How much the final ranking trusts the relation-path prior: the path_end weight, calibrated on validation.

The final score of a node is the scoring head's output plus ``w * path_end`` (``model.path_end_residual``),
with ``w`` learnt jointly with the head. When most training questions are generated from the graph, the
head also learns corrections that fit the generated wording and misfire on real questions, and the
learnt ``w`` leaves them too much say. Only the final order changes with ``w`` (the expansion reads
path_end as a feature, not through ``w``), so after each kept epoch ``calibrate_path_end`` tries ``w``
times each of ``PATH_END_SCALES`` on the validation sample and keeps the largest multiple whose mean
reciprocal rank is within one standard error (of the paired difference) of the best multiple's. That is
the rule the prior's own text-match weights follow (``seeder.retrieve.path_text.choose_weight``), for the
same reason: validation questions generated like the training ones fit the head's corrections and
undervalue the prior, so where validation cannot tell the multiples apart the final order trusts the
prior more; a multiple that ranks clearly worse is never taken. On MetaQA with 100 real training
questions this took the policy's one-hop val Hit@1 from below the prior alone to above it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from seeder.config import SeederConfig
from seeder.policy.inference import QueryData, evaluate_per_query, mean_metrics
from seeder.policy.model import SeedERPolicy

PATH_END_SCALES = (1.0, 2.0, 4.0, 8.0)
"""Multipliers of the learnt path_end weight tried on validation; 1 is the learnt weight itself."""


@dataclass(frozen=True)
class Calibration:
    """The chosen multiplier of the learnt weight, the weight it gives, and the validation metrics there."""

    scale: float
    weight: float
    metrics: dict[str, float]


def paired_gain(candidate: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Mean of ``candidate - reference`` over the queries, and its standard error."""
    diff = np.asarray(candidate, np.float64) - np.asarray(reference, np.float64)
    if len(diff) < 2:
        return float(diff.mean()) if len(diff) else 0.0, float("inf")
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def level_with(candidate: np.ndarray, best: np.ndarray) -> bool:
    """Whether ``candidate``'s per-query metric falls short of ``best``'s by at most one standard error
    of the paired difference (the best itself is level with itself)."""
    gain, error = paired_gain(candidate, best)
    return -gain <= error


def calibrate_path_end(
    model: SeedERPolicy, val_data: QueryData, config: SeederConfig, reference: dict[str, np.ndarray] | None = None
) -> Calibration | None:
    """Choose the path_end weight of ``model`` on ``val_data`` (see the module docstring).

    ``reference`` is the learnt weight's per-query validation metrics when the caller already has them.
    The model is left with its learnt weight; the caller stores ``Calibration.weight`` where it keeps the
    model. Returns None when there is nothing to calibrate: no path_end residual, or no validation
    node with a prior path_end (the cosine filter)."""
    weight = model.path_end_weight
    if weight is None or not np.any(val_data.subgraphs.path_end):
        return None
    learnt = weight.detach().clone()
    if reference is None:
        _, reference = evaluate_per_query(model, val_data, config)
    tried = {1.0: reference}
    try:
        for scale in PATH_END_SCALES[1:]:
            with torch.no_grad():
                weight.copy_(learnt * scale)
            tried[scale] = evaluate_per_query(model, val_data, config)[1]
    finally:
        with torch.no_grad():
            weight.copy_(learnt)
    best = max(tried, key=lambda scale: tried[scale]["mrr"].mean())
    chosen = max(scale for scale in tried if level_with(tried[scale]["mrr"], tried[best]["mrr"]))
    return Calibration(chosen, float(learnt * chosen), mean_metrics(tried[chosen]))
