"""The common output of every retriever, and the per-query ranking of flat arrays they share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seeder.data.ragged import run_positions


@dataclass
class RetrievalResult:
    """Rankings of Q queries.

    ``ranking[i]`` lists node ids best first, padded with -1 only when fewer distinct candidates
    exist; no id repeats within a row. The retrieved set of query ``i`` (what Hit@any, Recall@any,
    precision and F1 measure) is ``ranking[i, :set_size[i]]``, so the width L is at least
    ``set_size.max()``.
    """

    query_ids: np.ndarray  # int64 [Q]
    ranking: np.ndarray  # int64 [Q, L]
    set_size: np.ndarray  # int64 [Q]

    def __post_init__(self) -> None:
        if self.ranking.ndim != 2 or len(self.ranking) != len(self.query_ids) != len(self.set_size):
            raise ValueError("ranking must be [Q, L] with one query id and one set size per row")
        if len(self.set_size) and self.set_size.max(initial=0) > self.ranking.shape[1]:
            raise ValueError("set_size exceeds the ranking width")


def group_rank(group: np.ndarray, score: np.ndarray, tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order flat items by (group, -score, tiebreak); return (order, rank of each ordered item in its group)."""
    order = np.lexsort((tiebreak, -score, group))
    g = group[order]
    return order, run_positions(g)
