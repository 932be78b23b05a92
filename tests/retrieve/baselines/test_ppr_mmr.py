"""MMR's greedy order on a hand-made example and against a plain loop; PPR + MMR end to end."""

from __future__ import annotations

import numpy as np

from seeder.retrieve.baselines import ppr_mmr
from tests.retrieve.baselines.helpers import baselines_config

from .helpers import normalised, random_inputs


def test_mmr_trades_relevance_for_novelty_in_the_hand_computed_order():
    # Items 0 and 1 are the same direction; 2 is orthogonal. With lambda = 0.78:
    # step 2 scores item 1 at 0.78*0.8 - 0.22*1 = 0.404 and item 2 at 0.78*0.6 - 0 = 0.468 -> 2 first.
    embeddings = np.array([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    relevance = np.array([[1.0, 0.8, 0.6]])
    order = ppr_mmr.mmr_select(relevance, embeddings, np.ones((1, 3), bool), 3, 0.78)
    assert order.tolist() == [[0, 2, 1]]
    # Pure relevance (lambda = 1) keeps the relevance order.
    assert ppr_mmr.mmr_select(relevance, embeddings, np.ones((1, 3), bool), 3, 1.0).tolist() == [[0, 1, 2]]


def _mmr_loop(relevance, embeddings, valid, select, lam):
    chosen = []
    candidates = [i for i in range(len(relevance)) if valid[i]]
    while candidates and len(chosen) < select:

        def score(i):
            redundancy = max((float(embeddings[i] @ embeddings[j]) for j in chosen), default=0.0)
            return lam * relevance[i] - (1 - lam) * redundancy

        best = max(candidates, key=lambda i: (score(i), -i))
        chosen.append(best)
        candidates.remove(best)
    return chosen + [-1] * (select - len(chosen))


def test_batched_mmr_equals_a_plain_loop_per_query():
    rng = np.random.default_rng(5)
    q, pool, dim = 6, 30, 8
    embeddings = normalised(rng, q * pool, dim).reshape(q, pool, dim).astype(np.float64)
    relevance = rng.random((q, pool))
    valid = rng.random((q, pool)) < 0.8
    valid[0, 5:] = False  # a pool smaller than the selection
    got = ppr_mmr.mmr_select(np.where(valid, relevance, -np.inf), embeddings, valid, 10, 0.78)
    for i in range(q):
        assert got[i].tolist() == _mmr_loop(relevance[i], embeddings[i], valid[i], 10, 0.78)


def test_ppr_mmr_ranks_the_selection_first():
    inputs = random_inputs(seed=4)
    cfg = baselines_config(mmr__select=8, mmr__pool=40)
    result = ppr_mmr.retrieve(inputs, cfg, 50)
    assert result.set_size.tolist() == [8] * len(inputs.query_ids)
    from seeder.retrieve.baselines.common import rank_candidates
    from seeder.retrieve.baselines.ppr import ppr_relevance

    ego, relevance = ppr_relevance(inputs, cfg)
    ranked, _ = rank_candidates(ego.num_queries, ego.query, ego.node, relevance)
    for i in range(len(inputs.query_ids)):
        assert result.ranking[i, 0] == ranked[i, 0]  # MMR starts from the most relevant node
        assert set(result.ranking[i, :8].tolist()) <= set(ranked[i, :40].tolist())
