"""Metrics from ranks, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.data.subgraphs import SubgraphSet
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.metrics import evaluate, per_query_metrics, subgraph_ceiling


def result(ranking, set_size):
    ranking = np.asarray(ranking, dtype=np.int64)
    return RetrievalResult(np.arange(len(ranking)), ranking, np.asarray(set_size, dtype=np.int64))


def test_hand_computed_cases():
    ranking = [
        [7, 3, 9, 1, 2, 5, -1, -1],  # answers 3 (rank 1) and 5 (rank 5)
        [4, 6, 8, 0, -1, -1, -1, -1],  # answer 11 absent from the ranking
        [2, 1, 0, 3, 4, 5, 6, 8],  # four answers, two ranked (ranks 0 and 7), two absent
    ]
    answer_ptr = np.array([0, 2, 3, 7])
    answers = np.array([5, 3, 11, 2, 8, 40, 41])
    m = per_query_metrics(result(ranking, [3, 4, 8]), answer_ptr, answers, ks=(1, 2, 6))
    np.testing.assert_allclose(m["hit_at_1"], [0, 0, 1])
    np.testing.assert_allclose(m["hit_at_2"], [1, 0, 1])
    np.testing.assert_allclose(m["recall_at_2"], [0.5, 0, 0.25])  # divides by the number of answers
    np.testing.assert_allclose(m["recall_at_6"], [1.0, 0, 0.25])
    np.testing.assert_allclose(m["mrr"], [0.5, 0, 1.0])
    np.testing.assert_allclose(m["hit_any"], [1, 0, 1])
    np.testing.assert_allclose(m["recall_any"], [0.5, 0, 0.5])
    np.testing.assert_allclose(m["precision"], [1 / 3, 0, 2 / 8])
    np.testing.assert_allclose(m["f1"], [2 * (1 / 3) * 0.5 / (1 / 3 + 0.5), 0, 2 * 0.25 * 0.5 / 0.75])
    np.testing.assert_allclose(m["set_size"], [3, 4, 8])


def test_duplicate_answers_count_once_and_attribute_groups():
    ranking = [[1, 2, 3], [3, 2, 1], [9, 8, 7]]
    answer_ptr = np.array([0, 2, 3, 4])
    answers = np.array([2, 2, 1, 5])  # query 0 lists answer 2 twice
    out = evaluate(result(ranking, [1, 3, 3]), answer_ptr, answers, {"hop": np.array([1, 2, 1])}, ks=(1, 2))
    assert out["all"]["queries"] == 3
    assert out["all"]["recall_at_2"] == pytest.approx((1 + 0 + 0) / 3)
    assert out["all"]["mrr"] == pytest.approx((1 / 2 + 1 / 3 + 0) / 3)
    assert out["hop=1"]["queries"] == 2 and out["hop=1"]["mrr"] == pytest.approx(0.25)
    assert out["hop=2"]["hit_any"] == 1.0 and out["hop=2"]["hit_at_2"] == 0.0
    assert list(out) == ["all", "hop=1", "hop=2"]


def test_scores_signs_do_not_matter():
    """Only positions count: a ranking is a ranking whatever the scores behind it were."""
    ranking = [[5, 6, 7]]
    m = per_query_metrics(result(ranking, [3]), np.array([0, 1]), np.array([7]), ks=(1, 3))
    assert m["mrr"][0] == pytest.approx(1 / 3) and m["hit_at_3"][0] == 1 and m["hit_at_1"][0] == 0


def test_empty_set_and_all_padding():
    m = per_query_metrics(result([[-1, -1]], [0]), np.array([0, 1]), np.array([0]), ks=(1,))
    assert m["hit_any"][0] == 0 and m["precision"][0] == 0 and m["f1"][0] == 0 and m["mrr"][0] == 0


def test_subgraph_ceiling():
    sg = SubgraphSet(
        query_ids=np.array([1, 2, 3]),
        splits=np.array(["val"] * 3, dtype=object),
        node_ptr=np.array([0, 3, 5, 9]),
        nodes=np.array([10, 11, 12, 20, 21, 30, 31, 32, 33]),
        hop=np.array([0, 1, 1, 0, 1, 0, 1, 2, 2], np.int8),
        score=np.zeros(9, np.float32),
        is_answer=np.array([0, 1, 0, 0, 0, 1, 0, 1, 0], bool),
        path_end=np.zeros(9, np.float32),
        edge_ptr=np.zeros(4, np.int64),
        edge_src=np.zeros(0, np.int32),
        edge_dst=np.zeros(0, np.int32),
        edge_rel=np.zeros(0, np.int32),
        answer_ptr=np.array([0, 1, 2, 6]),
        answers=np.array([11, 99, 30, 32, 34, 35]),
    )
    out = subgraph_ceiling(sg, {"kind": np.array(["a", "b", "a"], dtype=object)})
    assert out["all"]["hit_any"] == pytest.approx(2 / 3)
    assert out["all"]["recall_any"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert out["all"]["size"] == pytest.approx(3)
    assert out["kind=a"]["queries"] == 2 and out["kind=a"]["recall_any"] == pytest.approx(0.75)


def test_list_valued_and_high_cardinality_attributes_make_no_groups():
    ranking = [[1, 2], [3, 4], [5, 6]]
    attributes = {
        "path": np.asarray([[0, 1], [2], [1, 1]], dtype=object),  # relation sequences
        "start": np.arange(3),  # fine with 3 queries ...
        "multi": np.array([True, False, True]),
    }
    out = evaluate(result(ranking, [2, 2, 2]), np.array([0, 1, 2, 3]), np.array([1, 4, 9]), attributes, ks=(1,))
    assert "path=[0, 1]" not in out and not any(k.startswith("path") for k in out)
    assert out["multi=True"]["queries"] == 2 and out["multi=True"]["hit_at_1"] == 0.5
    assert out["start=1"]["queries"] == 1
    many = {"start": np.arange(3)}
    import seeder.retrieve.metrics as metrics

    old, metrics.MAX_GROUPS_PER_ATTRIBUTE = metrics.MAX_GROUPS_PER_ATTRIBUTE, 2
    try:
        out = evaluate(result(ranking, [2, 2, 2]), np.array([0, 1, 2, 3]), np.array([1, 4, 9]), many, ks=(1,))
    finally:
        metrics.MAX_GROUPS_PER_ATTRIBUTE = old
    assert list(out) == ["all"]


def test_results_are_grouped_by_hop_or_a_question_type_never_by_an_id():
    from seeder.retrieve.metrics import group_by

    n = 40
    attributes = {
        "topic_id": np.arange(n),
        "qtype": np.array(["a", "b", "c", "d"] * 10, dtype=object),
        "hop": np.array([1, 2] * 20),
    }
    assert list(group_by(attributes)) == ["hop"]
    without_hop = {k: v for k, v in attributes.items() if k != "hop"}
    assert list(group_by(without_hop)) == ["qtype"]
    assert group_by({"topic_id": np.arange(n) % 5}) == {}  # id-like, even with few values
    assert list(group_by(attributes, ["qtype", "hop"])) == ["qtype", "hop"]
    with pytest.raises(ValueError, match="no such attribute"):
        group_by(attributes, ["kind"])
