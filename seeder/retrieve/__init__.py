"""Retrievers: seeding, K-HOP-WITH-FILTERING, the reference retrievers and the paper's baselines.

Every retriever returns a ``RetrievalResult``: a full ranking of node ids per query plus the size of
the retrieved set (its first ``set_size`` entries), so one set of metrics serves all of them.
"""

from seeder.retrieve.base import RetrievalResult

__all__ = ["RetrievalResult"]
