"""BM25 against a hand-computed Lucene BM25 on a toy corpus; reciprocal rank fusion by hand; seeding."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from seeder.data.store import open_dataset, write_dataset
from seeder.retrieve import lexical
from seeder.retrieve.baselines import bm25
from seeder.retrieve.baselines.common import BaselineInputs, InMemoryGraph
from seeder.retrieve.seeds import dense_seeds
from tests.retrieve.baselines.helpers import baselines_config

CORPUS = [
    "paris is the capital of france",
    "the film was directed in paris paris",
    "berlin capital germany",
    "a quiet village",
    "france and germany share a border near the rhine",
]


def _lucene_bm25(query: str, docs: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """The oracle: idf = ln(1 + (N - df + 0.5) / (df + 0.5)) times tf / (tf + k1 (1 - b + b |d| / avgdl)).

    Lucene's variant, which drops the classic (k1 + 1) numerator factor (a constant: same order).

    Tokens are lower-case words of two or more characters (bm25s's default pattern), no stopwords.
    """
    tokenised = [[w for w in d.lower().split() if len(w) >= 2] for d in docs]
    avg = sum(map(len, tokenised)) / len(tokenised)
    scores = []
    for words in tokenised:
        total = 0.0
        for term in set(w for w in query.lower().split() if len(w) >= 2):
            df = sum(term in d for d in tokenised)
            if df == 0:
                continue
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            tf = words.count(term)
            total += idf * tf / (tf + k1 * (1 - b + b * len(words) / avg))
        scores.append(total)
    return scores


@pytest.mark.parametrize("query", ["paris france", "capital germany", "the rhine border", "village paris film"])
def test_bm25_scores_and_order_match_the_formula(query):
    index = lexical.BM25Index.build(CORPUS, stopwords="")
    ids, scores = index.topk([query], len(CORPUS))
    want = _lucene_bm25(query, CORPUS)
    expected_order = sorted((i for i in range(len(CORPUS)) if want[i] > 0), key=lambda i: (-want[i], i))
    assert ids[0, : len(expected_order)].tolist() == expected_order
    assert (ids[0, len(expected_order) :] == -1).all()  # documents sharing no term are not candidates
    np.testing.assert_allclose(scores[0, : len(expected_order)], [want[i] for i in expected_order], rtol=1e-5)


def test_reciprocal_rank_fusion_by_hand():
    a, b, c, d = 10, 11, 12, 13
    ids, scores = lexical.reciprocal_rank_fusion([np.array([[a, b, c]]), np.array([[c, a, d]])], 60)
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63.
    assert ids.tolist() == [[a, c, b, d]]
    np.testing.assert_allclose(scores[0], [1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62, 1 / 63])


def _toy_inputs():
    rng = np.random.default_rng(0)
    n = len(CORPUS)
    nodes = rng.standard_normal((n, 4)).astype(np.float32)
    nodes /= np.linalg.norm(nodes, axis=1, keepdims=True)
    graph = InMemoryGraph.from_edges(n, 1, [0, 2], [1, 4], [0, 0])
    relations = np.eye(4, dtype=np.float32)[:2]
    queries = nodes[[3, 1]] * 0.9 + 0.1  # dense favours node 3 for query 0
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return BaselineInputs(graph, nodes, relations, np.array([5, 6]), queries, ["capital germany", "zzz"], CORPUS)


def test_bm25_and_hybrid_retrievers_give_full_rankings():
    inputs = _toy_inputs()
    cfg = baselines_config(bm25__stopwords="", hybrid__pool=5)
    lexical = bm25.retrieve_bm25(inputs, cfg, 5)
    want = _lucene_bm25("capital germany", CORPUS)
    matched = sorted((i for i in range(5) if want[i] > 0), key=lambda i: (-want[i], i))
    assert lexical.set_size[0] == len(matched) == 3
    assert lexical.ranking[0, :3].tolist() == matched
    assert lexical.set_size.tolist()[1] == 0  # no shared term: nothing retrieved, all filled by cosine
    assert sorted(lexical.ranking[1].tolist()) == list(range(5))
    hybrid = bm25.retrieve_hybrid(inputs, cfg, 5)
    for row in hybrid.ranking.tolist():
        assert sorted(row) == list(range(5))
    with pytest.raises(Exception, match="query texts"):
        bm25.retrieve_bm25(
            BaselineInputs(inputs.graph, inputs.node_features, inputs.relation_features, inputs.query_ids, inputs.query_features),
            cfg,
            5,
        )


def test_seeding_functions_read_the_dataset(tmp_path):
    n = len(CORPUS)
    nodes = pa.table({"id": np.arange(n), "type": ["doc"] * n, "name": [f"d{i}" for i in range(n)], "text": CORPUS})
    relations = pa.table({"id": np.array([0], np.int32), "name": ["r"], "text": ["r"], "inverse_text": ["inv r"]})
    edges = pa.table({"src": np.array([0]), "dst": np.array([1]), "relation": np.array([0], np.int32)})
    queries = pa.table({"id": [0], "text": ["q"], "answers": [[0]], "split": ["val"]})
    kg = open_dataset(write_dataset(tmp_path / "kg", nodes, relations, edges, queries))
    ids, scores = lexical.bm25_seeds(kg, ["paris france", "nothing shared"], 2, baselines_config(bm25__stopwords=""))
    want = _lucene_bm25("paris france", CORPUS)
    assert ids[0].tolist() == sorted(range(n), key=lambda i: (-want[i], i))[:2]
    assert ids[1].tolist() == [-1, -1]
    assert np.isneginf(scores[1]).all()  # padded like dense_seeds
    np.testing.assert_allclose(scores[0], sorted((w for w in want if w > 0), reverse=True)[:2], rtol=1e-5)
    feats = np.eye(n, dtype=np.float32)
    hids, _ = lexical.hybrid_seeds(kg, ["paris france", "nothing shared"], dense_seeds(feats[[4, 3]], feats, n)[0], 2)
    assert hids.shape == (2, 2)
    assert hids[1, 0] == 3  # only the dense list votes for the second query
