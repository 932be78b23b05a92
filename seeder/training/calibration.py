"""How much the final ranking trusts the relation-path prior: the path_end weight, calibrated on validation.

The final score of a node is the scoring head's output plus ``w * path_end`` (``model.path_end_residual``),
with ``w`` learnt jointly with the head. When most training questions are generated from the graph, the
head also learns corrections that fit the generated wording and misfire on real questions, and the
learnt ``w`` leaves them too much say. Only the final order changes with ``w`` (the expansion reads
path_end as a feature, not through ``w``), so after each kept epoch ``calibrate_path_end`` tries ``w``
times each of ``PATH_END_SCALES`` on the validation sample and keeps the scale whose mean reciprocal rank
beats the learnt weight's by more than one standard error of the paired difference; otherwise the learnt
weight stays. On MetaQA with 100 real training questions this took the policy's one-hop val Hit@1 from
below the prior alone to above it; where the learnt weight is already right, the rule keeps it.
Validation questions generated like the training ones seldom show the head's misfires (they fit its
corrections), so the gain needs validation questions worded as users ask.
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
    kept = Calibration(1.0, float(learnt), mean_metrics(reference))
    best, best_gain, best_error = kept, 0.0, 0.0
    try:
        for scale in PATH_END_SCALES[1:]:
            with torch.no_grad():
                weight.copy_(learnt * scale)
            _, per_query = evaluate_per_query(model, val_data, config)
            gain, error = paired_gain(per_query["mrr"], reference["mrr"])
            if gain > best_gain:
                best_gain, best_error = gain, error
                best = Calibration(scale, float(learnt * scale), mean_metrics(per_query))
    finally:
        with torch.no_grad():
            weight.copy_(learnt)
    return best if best_gain > best_error else kept
