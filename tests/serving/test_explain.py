"""Expansion paths on a hand-made subgraph: seed first, the edges' directions kept, and among parallel
edges from one parent the relation that fits the question best."""

from __future__ import annotations

import numpy as np

from seeder.data.subgraphs import SubgraphSet
from seeder.serving.explain import expansion_paths

NUM_RELATIONS = 3


def subgraph(edges: list[tuple[int, int, int]]) -> SubgraphSet:
    """One question over global nodes 10, 11, 12, 13 (local 0..3) with ``edges`` (local src, local dst,
    relation)."""
    src, dst, rel = (np.array(c, dtype=np.int32) for c in zip(*edges))
    return SubgraphSet(
        query_ids=np.array([7]),
        splits=np.array(["new"], dtype=object),
        node_ptr=np.array([0, 4]),
        nodes=np.array([10, 11, 12, 13]),
        hop=np.array([0, 1, 2, 1], np.int8),
        score=np.zeros(4, np.float32),
        is_answer=np.zeros(4, bool),
        path_end=np.zeros(4, np.float32),
        edge_ptr=np.array([0, len(edges)]),
        edge_src=src,
        edge_dst=dst,
        edge_rel=rel,
        answer_ptr=np.array([0, 0]),
        answers=np.zeros(0, np.int64),
    )


# Node 10 is the seed, 11 was added at step 0 and 12 at step 1; 13 is outside the retrieved set.
RANKING = np.array([[12, 11, 10, 13]])
STEPS = np.array([[2, 1, 0, -1]])
# 10 -0-> 11 and 10 -1-> 11 (parallel edges), 12 -2-> 11 (walked against its direction), 13 -0-> 12.
EDGES = [(0, 1, 0), (0, 1, 1), (2, 1, 2), (3, 2, 0)]


def hops(relation_scores=None) -> list[list[tuple[int, int, bool, int]]]:
    """Each ranked node's path as (from, relation, forward, to) hops, seed first."""
    hop_from, hop_rel, hop_along, hop_to = expansion_paths(subgraph(EDGES), RANKING, STEPS, relation_scores)
    return [
        [
            (int(f), int(r), bool(a), int(t))
            for f, r, a, t in zip(*(x[0, i] for x in (hop_from, hop_rel, hop_along, hop_to)))
            if f >= 0
        ]
        for i in range(RANKING.shape[1])
    ]


def test_paths_start_at_the_seed_and_keep_each_hops_direction():
    node_12, node_11, seed, outside = hops()
    assert seed == [] and outside == []
    assert node_11 == [(10, 0, True, 11)]  # of two parallel edges, the first
    assert node_12 == [(10, 0, True, 11), (11, 2, False, 12)]  # 12 -2-> 11, walked from 11


def test_the_relation_that_fits_the_question_explains_a_node():
    scores = np.zeros((1, 2 * NUM_RELATIONS), np.float32)
    scores[0, 1] = 0.9  # relation 1, forward
    node_12, node_11, _, _ = hops(scores)
    assert node_11 == [(10, 1, True, 11)]
    assert node_12[0] == (10, 1, True, 11)
    # The inverse id (r + R) is the one that counts for a hop walked against its relation.
    scores = np.zeros((1, 2 * NUM_RELATIONS), np.float32)
    scores[0, 0 + NUM_RELATIONS] = 0.9
    assert hops(scores)[1] == [(10, 0, True, 11)]


def test_the_relation_path_prior_chooses_first_and_follows_the_chosen_parent():
    """A trie of two paths from the root: [1] then [1, 2 inverse]. The prior's mass on them picks
    relation 1 for node 11 over the first edge (relation 0) and over a cosine that prefers relation 0;
    node 12's hop continues from the trie node of 11's chosen path."""
    num_ids = 2 * NUM_RELATIONS
    children = np.full((3, num_ids), -1, np.int32)
    children[0, 1] = 1  # root -1-> trie node 1
    children[1, 2 + NUM_RELATIONS] = 2  # trie node 1 -2 (inverse)-> trie node 2
    terms = np.log(np.array([[1.0, 0.9, 0.8]], np.float32))
    cosine = np.zeros((1, num_ids), np.float32)
    cosine[0, 0] = 0.9
    hop_from, hop_rel, hop_along, hop_to = expansion_paths(subgraph(EDGES), RANKING, STEPS, cosine, (terms, children))
    assert [int(r) for r in hop_rel[0, 1] if r >= 0] == [1]
    assert [int(r) for r in hop_rel[0, 0] if r >= 0] == [1, 2] and not bool(hop_along[0, 0, 1])
    # Without mass on relation 1's path, the cosine decides among the off-trie edges.
    hop_rel = expansion_paths(subgraph(EDGES), RANKING, STEPS, cosine, (terms, np.full((3, num_ids), -1, np.int32)))[1]
    assert [int(r) for r in hop_rel[0, 1] if r >= 0] == [0]
