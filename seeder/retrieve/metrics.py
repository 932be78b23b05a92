"""Retrieval metrics (paper, Appendix C), computed from ranks, never from raw scores.

For every query we find the position of each of its (distinct) answers in the ranking with one
vectorised membership test (sorted ``(query, node)`` keys + ``searchsorted``); answers absent from
the ranking have no rank. From those ranks:

- ``hit_at_k``: some answer within the first k;
- ``recall_at_k``: answers within the first k / number of answers (STaRK's definition: a query with
  40 answers reaches at most 0.5 at k = 20);
- ``mrr``: 1 / (1 + rank of the first answer), 0 without one;
- ``hit_any``, ``recall_any``, ``precision``, ``f1``: the same over the retrieved set (the first
  ``set_size`` entries); ``set_size``: its mean size.

Every metric is a per-query value averaged over queries, overall and per attribute value
(``"hop=2"``; only scalar attributes with at most ``MAX_GROUPS_PER_ATTRIBUTE`` values). Metric names
avoid ``@`` (MLflow rejects it).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.retrieve.base import RetrievalResult


def _distinct_answers(answer_ptr: np.ndarray, answers: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct (query, answer) keys ``query * base + answer`` and the count per query."""
    num_q = len(answer_ptr) - 1
    q = np.repeat(np.arange(num_q), np.diff(answer_ptr))
    keys = np.unique(q * base + np.asarray(answers, dtype=np.int64))
    return keys, np.bincount(keys // base, minlength=num_q)


def answer_ranks(ranking: np.ndarray, answer_ptr: np.ndarray, answers: np.ndarray):
    """(query of each distinct answer, its 0-based rank or -1 when absent, answers per query)."""
    ranking = np.asarray(ranking, dtype=np.int64)
    num_q, width = ranking.shape
    answers = np.asarray(answers, dtype=np.int64)
    base = int(max(ranking.max(initial=-1), answers.max(initial=-1))) + 1
    answer_keys, num_answers = _distinct_answers(np.asarray(answer_ptr), answers, base)
    q, col = np.nonzero(ranking >= 0)
    rank_keys = q * base + ranking[q, col]
    order = np.argsort(rank_keys, kind="stable")
    rank_keys, col = rank_keys[order], col[order]
    ranks = np.full(len(answer_keys), -1, dtype=np.int64)
    found, pos = sorted_lookup(rank_keys, answer_keys)
    ranks[found] = col[pos[found]]
    return answer_keys // base, ranks, num_answers


def per_query_metrics(
    result: RetrievalResult, answer_ptr: np.ndarray, answers: np.ndarray, ks: Sequence[int] = (1, 5, 20)
) -> dict[str, np.ndarray]:
    """Every metric as one float64 value per query (averaged by ``evaluate``)."""
    num_q = len(result.query_ids)
    if len(answer_ptr) != num_q + 1:
        raise ValueError(f"answer_ptr has {len(answer_ptr)} entries for {num_q} queries (expected Q+1)")
    q, ranks, num_answers = answer_ranks(result.ranking, answer_ptr, answers)
    denom = np.maximum(num_answers, 1).astype(np.float64)
    present = ranks >= 0
    out: dict[str, np.ndarray] = {}
    for k in ks:
        within = np.bincount(q[present & (ranks < k)], minlength=num_q)
        out[f"hit_at_{k}"] = (within > 0).astype(np.float64)
        out[f"recall_at_{k}"] = within / denom
    first = np.full(num_q, np.iinfo(np.int64).max)
    np.minimum.at(first, q[present], ranks[present])
    out["mrr"] = np.where(first < np.iinfo(np.int64).max, 1.0 / (first + 1.0), 0.0)
    set_size = np.asarray(result.set_size, dtype=np.int64)
    in_set = np.bincount(q[present & (ranks < set_size[q])], minlength=num_q)
    out["hit_any"] = (in_set > 0).astype(np.float64)
    out["recall_any"] = in_set / denom
    out["set_size"] = set_size.astype(np.float64)
    precision = in_set / np.maximum(set_size, 1)
    out["precision"] = precision
    total = precision + out["recall_any"]
    out["f1"] = np.where(total > 0, 2 * precision * out["recall_any"] / np.where(total > 0, total, 1), 0.0)
    return out


MAX_GROUPS_PER_ATTRIBUTE = 50
"""Attributes with more distinct values (a start node id, a free-text field) get no breakdown."""


def attribute_labels(column) -> np.ndarray | None:
    """One string label per query, or None for attributes that do not make groups: list-valued
    ones (a relation path) and ones with more than ``MAX_GROUPS_PER_ATTRIBUTE`` values."""
    try:
        array = np.asarray(column)
    except ValueError:  # ragged lists
        return None
    if array.ndim != 1:
        return None
    if array.dtype == object and any(isinstance(v, (list, tuple, dict, np.ndarray)) for v in array):
        return None
    labels = array.astype(str)
    return labels if len(np.unique(labels)) <= MAX_GROUPS_PER_ATTRIBUTE else None


DEFAULT_GROUP_BY = "hop"
MAX_DEFAULT_GROUPS = 12


def group_by(attributes: dict[str, np.ndarray] | None, by: list[str] | None = None) -> dict[str, np.ndarray]:
    """The query attributes results are broken down by: the ones named in ``by`` (an unknown name is
    an error), else ``hop`` when the queries have it, else the groupable attribute with the fewest
    values if it has at most ``MAX_DEFAULT_GROUPS`` (a question type). Id-like attributes (a topic
    node, ``*_id``) never make groups by default: on a small split they give a group per query."""
    attributes = attributes or {}
    if by:
        unknown = [name for name in by if name not in attributes]
        if unknown:
            raise ValueError(
                f"--by {', '.join(unknown)}: the queries have no such attribute; they have: {', '.join(attributes) or 'none'}"
            )
        return {name: attributes[name] for name in by}
    if DEFAULT_GROUP_BY in attributes and attribute_labels(attributes[DEFAULT_GROUP_BY]) is not None:
        return {DEFAULT_GROUP_BY: attributes[DEFAULT_GROUP_BY]}
    candidates = []
    for name, column in attributes.items():
        labels = attribute_labels(column)
        if labels is None or name == "id" or name.endswith("_id"):
            continue
        count = len(np.unique(labels))
        if 1 < count <= MAX_DEFAULT_GROUPS:
            candidates.append((count, name))
    return {min(candidates)[1]: attributes[min(candidates)[1]]} if candidates else {}


def group_means(values: dict[str, np.ndarray], attributes: dict[str, np.ndarray] | None) -> dict[str, dict]:
    """The mean of each per-query value and the number of queries: over all queries (``all``) and per
    value of each attribute that makes groups (``name=value``)."""
    num_q = len(next(iter(values.values()))) if values else 0
    groups: dict[str, np.ndarray] = {"all": np.ones(num_q, dtype=bool)}
    for name, column in (attributes or {}).items():
        if len(column) != num_q:
            raise ValueError(f"attribute {name!r} has {len(column)} values for {num_q} queries")
        labels = attribute_labels(column)
        if labels is None:
            continue
        for value in sorted(np.unique(labels).tolist(), key=lambda s: (len(s), s)):
            groups[f"{name}={value}"] = labels == value
    out = {}
    for label, mask in groups.items():
        entry = {name: float(v[mask].mean()) if mask.any() else float("nan") for name, v in values.items()}
        entry["queries"] = int(mask.sum())
        out[label] = entry
    return out


def evaluate(
    result: RetrievalResult,
    answer_ptr: np.ndarray,
    answers: np.ndarray,
    attributes: dict[str, np.ndarray] | None = None,
    ks: Sequence[int] = (1, 5, 20),
) -> dict[str, dict[str, float]]:
    """Mean metrics: ``{"all": {...}, "hop=1": {...}, ...}``; each entry also has ``queries``.

    ``answer_ptr``/``answers`` give each query's answers (in ``result.query_ids`` order);
    ``attributes`` maps an attribute name to one value per query.
    """
    return group_means(per_query_metrics(result, answer_ptr, answers, ks), attributes)


def subgraph_ceiling(subgraphs: SubgraphSet, attributes: dict[str, np.ndarray] | None = None) -> dict[str, dict]:
    """What the best ranker restricted to each subgraph could reach: Hit@any and Recall@any of the
    whole subgraph, its mean size, and the number of queries; overall and per attribute value."""
    return group_means(ceiling_values(subgraphs), attributes)


def ceiling_values(subgraphs: SubgraphSet) -> dict[str, np.ndarray]:
    """Per query, in the set's order: ``hit_any`` and ``recall_any`` of its whole subgraph, ``size``."""
    num_q = len(subgraphs)
    _, num_answers = _distinct_answers(
        subgraphs.answer_ptr, subgraphs.answers, int(max(subgraphs.answers.max(initial=-1), 0)) + 1
    )
    owner = np.repeat(np.arange(num_q), subgraphs.sizes)
    # Subgraph nodes are distinct, so answer nodes inside = distinct answers found.
    found = np.bincount(owner[subgraphs.is_answer], minlength=num_q)
    values = {
        "hit_any": (found > 0).astype(np.float64),
        "recall_any": found / np.maximum(num_answers, 1),
        "size": subgraphs.sizes.astype(np.float64),
    }
    return values
