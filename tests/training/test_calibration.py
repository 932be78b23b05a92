"""The path_end weight's calibration on validation: it raises the weight where that ranks as well or
better, never to a multiple that ranks clearly worse, leaves the model as it found it, and the training
loop keeps the calibrated weight in the best model."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from seeder.config import load_config
from seeder.policy.inference import QueryData, evaluate
from seeder.policy.model import SeedERPolicy
from seeder.policy.toy import toy_task
from seeder.training.calibration import PATH_END_SCALES, calibrate_path_end, level_with, paired_gain
from seeder.training.loop import build_state, export_best, fit, steps_per_epoch

# Every node of a toy subgraph enters the final set, so only the final scores decide the order.
WHOLE_SET = ["train.expansion_sizes=[15,15]", "train.frontier_caps=[30,30]", "model.dropout=0.0", "train.batch_size=16"]


def with_path_end(data: QueryData, on_answers: float) -> QueryData:
    """The toy task with a path_end of ``on_answers`` on its answers and 0 elsewhere."""
    path_end = np.where(data.subgraphs.is_answer, on_answers, 0.0).astype(np.float32)
    return replace(data, subgraphs=replace(data.subgraphs, path_end=path_end))


def untrained(data: QueryData, config) -> SeedERPolicy:
    torch.manual_seed(0)
    return SeedERPolicy(data.feature_dim, config.model).eval()


def test_paired_gain_is_the_mean_difference_and_its_standard_error():
    gain, error = paired_gain(np.array([1.0, 1.0, 0.5, 1.0]), np.array([0.5, 1.0, 0.5, 0.5]))
    assert gain == pytest.approx(0.25)
    assert error == pytest.approx(np.std([0.5, 0, 0, 0.5], ddof=1) / 2)


def test_a_prior_that_marks_the_answers_gets_more_weight_than_an_untrained_head_gives_it():
    config = load_config(None, WHOLE_SET)
    data = with_path_end(toy_task(96, 30, 8, seed=1), on_answers=0.05)
    model = untrained(data, config)
    learnt = float(model.path_end_weight.detach())
    _, before = evaluate(model, data, config)
    calibration = calibrate_path_end(model, data, config)
    assert calibration is not None and calibration.scale > 1
    assert calibration.scale in PATH_END_SCALES
    assert calibration.weight == pytest.approx(learnt * calibration.scale)
    assert calibration.metrics["mrr"] > before["mrr"]
    # The model keeps its learnt weight: the caller decides where the calibrated one goes.
    assert float(model.path_end_weight.detach()) == learnt
    model.path_end_weight.data.fill_(calibration.weight)
    assert evaluate(model, data, config)[1]["mrr"] == pytest.approx(calibration.metrics["mrr"])


def test_a_prior_that_points_away_from_the_answers_keeps_the_learnt_weight():
    config = load_config(None, WHOLE_SET)
    data = with_path_end(toy_task(96, 30, 8, seed=1), on_answers=-0.05)
    model = untrained(data, config)
    _, before = evaluate(model, data, config)
    calibration = calibrate_path_end(model, data, config)
    assert calibration is not None and calibration.scale == 1.0
    assert calibration.metrics["mrr"] == pytest.approx(before["mrr"])


def test_multiples_level_on_validation_keep_the_largest():
    # A path_end shared by every node of a question moves no node past another: every multiple ranks
    # alike, and the rule then trusts the prior the most.
    config = load_config(None, WHOLE_SET)
    data = toy_task(64, 30, 8, seed=1)
    per_question = np.repeat(np.linspace(-1.0, 1.0, len(data.subgraphs)), data.subgraphs.sizes).astype(np.float32)
    data = replace(data, subgraphs=replace(data.subgraphs, path_end=per_question))
    model = untrained(data, config)
    _, before = evaluate(model, data, config)
    calibration = calibrate_path_end(model, data, config)
    assert calibration is not None and calibration.scale == max(PATH_END_SCALES)
    assert calibration.metrics["mrr"] == pytest.approx(before["mrr"])


def test_level_with_allows_one_standard_error_below_the_best():
    best = np.array([1.0, 1.0, 1.0, 1.0])
    assert level_with(best, best)
    assert level_with(np.array([1.0, 1.0, 1.0, 0.5]), best)  # 0.125 short, standard error 0.125
    assert not level_with(np.array([0.5, 0.5, 0.5, 0.0]), best)


def test_nothing_to_calibrate_without_a_prior_or_without_the_residual():
    config = load_config(None, WHOLE_SET)
    data = toy_task(32, 30, 8, seed=1)  # path_end is 0 everywhere, as with the cosine filter
    assert calibrate_path_end(untrained(data, config), data, config) is None
    no_residual = load_config(None, [*WHOLE_SET, "model.path_end_residual=false"])
    assert calibrate_path_end(untrained(data, no_residual), with_path_end(data, 1.0), no_residual) is None


@pytest.mark.parametrize("calibrate", [True, False])
def test_the_kept_model_ranks_with_the_calibrated_weight_and_training_with_the_learnt_one(calibrate, tmp_path):
    config = load_config(
        None, [*WHOLE_SET, "train.epochs=1", "train.lr=1e-4", f"train.calibrate_path_end={str(calibrate).lower()}"]
    )
    data = with_path_end(toy_task(64, 30, 8, seed=1), on_answers=0.05)
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    fit(state, data, data)
    row = state.history[-1]
    learnt = float(state.model.path_end_weight.detach())
    kept = float(state.best_weights["path_end_weight"])
    if calibrate:
        assert row["path_end_scale"] > 1
        assert kept == pytest.approx(learnt * row["path_end_scale"])
        assert row["calibrated_val_mrr"] > row["val_mrr"]
    else:
        assert "path_end_scale" not in row and kept == learnt
    model_dir = export_best(state, tmp_path / "model")
    weights = torch.load(model_dir / "weights.pt", map_location="cpu")
    assert float(weights["path_end_weight"]) == pytest.approx(kept)
