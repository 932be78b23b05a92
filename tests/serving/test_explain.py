"""Expansion paths on a hand-made subgraph: seed first, the edges' directions kept, and among parallel
edges from one parent the relation that fits the question best."""

from __future__ import annotations

import numpy as np

from seeder.data.subgraphs import SubgraphSet
from seeder.serving.explain import PriorTerms, expansion_paths

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
    hop_from, hop_rel, hop_along, hop_to = expansion_paths(
        subgraph(EDGES), RANKING, STEPS, cosine, PriorTerms(terms, terms, children)
    )
    assert [int(r) for r in hop_rel[0, 1] if r >= 0] == [1]
    assert [int(r) for r in hop_rel[0, 0] if r >= 0] == [1, 2] and not bool(hop_along[0, 0, 1])
    # Without mass on relation 1's path, the cosine decides among the off-trie edges.
    hop_rel = expansion_paths(
        subgraph(EDGES), RANKING, STEPS, cosine, PriorTerms(terms, terms, np.full((3, num_ids), -1, np.int32))
    )[1]
    assert [int(r) for r in hop_rel[0, 1] if r >= 0] == [0]


def test_an_answer_picked_early_is_explained_along_the_priors_path_through_later_nodes():
    """Seed 10 starred 11 (an early pick, one hop away), was directed by 12, who directed 13, which
    starred 11. The prior's path is directed_by, directed_by inverse, starred: 11 is explained along
    it through 12 and 13, though both were selected after it; without the prior, by its own first hop."""
    starred, directed_by = 0, 1
    edges = [(0, 1, starred), (0, 2, directed_by), (3, 2, directed_by), (3, 1, starred)]
    ranking, steps = np.array([[11, 12, 13, 10]]), np.array([[1, 2, 3, 0]])
    num_ids = 2 * NUM_RELATIONS
    children = np.full((4, num_ids), -1, np.int32)
    children[0, directed_by] = 1
    children[1, directed_by + NUM_RELATIONS] = 2
    children[2, starred] = 3
    children[0, starred] = -1  # no path of the prior starts with starred
    terms = np.log(np.array([[1.0, 0.9, 0.9, 0.9]], np.float32))
    hop_from, hop_rel, hop_along, hop_to = expansion_paths(
        subgraph(edges), ranking, steps, None, PriorTerms(terms, terms, children)
    )
    answer = [
        (int(f), int(r), bool(a), int(t)) for f, r, a, t in zip(hop_from[0, 0], hop_rel[0, 0], hop_along[0, 0], hop_to[0, 0])
    ]
    assert answer == [(10, directed_by, True, 12), (12, directed_by, False, 13), (13, starred, True, 11)]
    assert [int(r) for r in hop_rel[0, 1] if r >= 0] == [directed_by]  # 12: the prior's first hop
    assert [int(r) for r in hop_rel[0, 3] if r >= 0] == []  # the seed
    plain = expansion_paths(subgraph(edges), ranking, steps)[1]
    assert [int(r) for r in plain[0, 0] if r >= 0] == [starred]


def test_a_walk_back_along_the_edge_it_took_loses_to_any_walk_as_likely():
    """11 ends two paths of the prior: r0, r1, r1 inverse, only by 10 -> 11 -> 12 -> 11 (back along the
    edge 11 -r1-> 12), and r2, by the edge 10 -r2-> 11. Where both end as much mass, the walk without the
    step back explains 11; where the longer path ends more, it does (the question's own logic)."""
    edges = [(0, 1, 0), (1, 2, 1), (0, 1, 2)]
    ranking, steps = np.array([[11, 12, 10, 13]]), np.array([[1, 2, 0, -1]])
    children = np.full((5, 2 * NUM_RELATIONS), -1, np.int32)
    children[0, 0] = 1
    children[1, 1] = 2
    children[2, 1 + NUM_RELATIONS] = 3
    children[0, 2] = 4
    path = np.log(np.array([[1.0, 0.9, 0.8, 0.7, 0.5]], np.float32))
    for longer, expected in ((0.5, [2]), (0.6, [0, 1, 1])):
        ending = np.log(np.array([[1e-6, 1e-6, 1e-6, longer, 0.5]], np.float32))
        hop_rel = expansion_paths(subgraph(edges), ranking, steps, None, PriorTerms(path, ending, children))[1]
        assert [int(r) for r in hop_rel[0, 0] if r >= 0] == expected


def test_an_answer_on_the_way_is_explained_by_the_path_that_ends_at_it():
    """ "Who wrote the films of the director of 10?": 11 directed 10 and 12, and wrote 12. Read as a node
    on the way, 11 is one hop from the seed (its path term, the mass through directed_by, is the largest);
    read as an answer it is the end of directed_by, directed_by inverse, written_by, which the ending mass
    picks: 10 -> 11 -> 12 -> 11, back to 11 by another edge than the one it left by."""
    directed_by, written_by = 0, 1
    edges = [(0, 1, directed_by), (2, 1, directed_by), (2, 1, written_by)]
    ranking, steps = np.array([[11, 12, 10, 13]]), np.array([[1, 2, 0, -1]])
    children = np.full((4, 2 * NUM_RELATIONS), -1, np.int32)
    children[0, directed_by] = 1
    children[1, directed_by + NUM_RELATIONS] = 2
    children[2, written_by] = 3
    path = np.log(np.array([[1.0, 0.99, 0.98, 0.97]], np.float32))
    ending = np.log(np.array([[1e-6, 0.01, 0.01, 0.97]], np.float32))
    hops = expansion_paths(subgraph(edges), ranking, steps, None, PriorTerms(path, ending, children))
    assert [int(r) for r in hops[1][0, 0] if r >= 0] == [directed_by, directed_by, written_by]
    assert [int(t) for t in hops[3][0, 0] if t >= 0] == [11, 12, 11]
    # By the path term alone (the ending mass gives no preference), the shorter walk.
    hops = expansion_paths(subgraph(edges), ranking, steps, None, PriorTerms(path, np.zeros_like(path), children))
    assert [int(r) for r in hops[1][0, 0] if r >= 0] == [directed_by]


def test_where_the_prior_cannot_tell_two_paths_apart_the_questions_wording_does():
    """ "Who directed 10?": 11 directed and wrote it. The prior, trained on questions whose director often
    wrote the film too, ends a little more mass on written_by; the question reads like directed_by,
    which then explains 11. Without the relations' fit to the question, the prior's mass decides; a
    clear lead of the prior is not overturned by the wording."""
    directed_by, written_by = 0, 1
    edges = [(0, 1, directed_by), (0, 1, written_by)]
    ranking, steps = np.array([[11, 10, 12, 13]]), np.array([[1, 0, -1, -1]])
    children = np.full((3, 2 * NUM_RELATIONS), -1, np.int32)
    children[0, directed_by] = 1
    children[0, written_by] = 2
    path = np.log(np.array([[1.0, 0.42, 0.55]], np.float32))
    fit = np.zeros((1, 2 * NUM_RELATIONS), np.float32)
    fit[0, directed_by], fit[0, written_by] = 0.45, 0.30
    hop_rel = expansion_paths(subgraph(edges), ranking, steps, fit, PriorTerms(path, path, children))[1]
    assert [int(r) for r in hop_rel[0, 0] if r >= 0] == [directed_by]
    hop_rel = expansion_paths(subgraph(edges), ranking, steps, None, PriorTerms(path, path, children))[1]
    assert [int(r) for r in hop_rel[0, 0] if r >= 0] == [written_by]
    lead = np.log(np.array([[1.0, 0.05, 0.9]], np.float32))
    hop_rel = expansion_paths(subgraph(edges), ranking, steps, fit, PriorTerms(lead, lead, children))[1]
    assert [int(r) for r in hop_rel[0, 0] if r >= 0] == [written_by]
