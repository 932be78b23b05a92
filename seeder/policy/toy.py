"""A tiny learnable retrieval task for tests and smoke runs: no graph, no preprocessing, one call."""

from __future__ import annotations

import numpy as np

from seeder.data.subgraphs import SubgraphSet
from seeder.policy.inference import QueryData


def toy_task(num_queries: int = 64, nodes_per_query: int = 30, dim: int = 8, num_relations: int = 3, seed: int = 0):
    """A tiny learnable retrieval task for tests and smoke runs: (QueryData, answers decided by structure).

    Each query owns ``nodes_per_query`` fresh nodes: 3 seeds (hop 0), a third of the rest at hop 1 (one
    edge from a random seed), the others at hop 2 (one edge from a random hop-1 node); relations are
    random. The answers are the hop-2 nodes reached by the relation path (1, 0) from the seeds, so only a
    model that reads relations and structure finds them; filter scores are noise.
    """
    rng = np.random.default_rng(seed)
    n = nodes_per_query
    num_hop1 = (n - 3) // 3
    hop = np.concatenate([np.zeros(3), np.ones(num_hop1), np.full(n - 3 - num_hop1, 2)]).astype(np.int8)
    parent = np.concatenate(
        [rng.integers(0, 3, size=(num_queries, num_hop1)), rng.integers(3, 3 + num_hop1, size=(num_queries, n - 3 - num_hop1))],
        axis=1,
    )  # [Q, n-3], local parent of nodes 3..n-1
    relation = rng.integers(0, num_relations, size=(num_queries, n - 3))
    parent_rel = np.concatenate([np.full((num_queries, 3), -1), relation], axis=1)  # relation into node
    grand_rel = np.take_along_axis(parent_rel, np.concatenate([np.zeros((num_queries, 3), int), parent], 1), 1)
    is_answer = (hop[None, :] == 2) & (parent_rel == 0) & (grand_rel == 1)
    # Guarantee one answer per query: make node n-1 an answer under hop-1 node 3 reached by relation 1.
    parent[:, 0] = 0
    relation[:, 0] = 1
    parent_rel[:, 3] = 1
    parent[:, -1] = 3
    relation[:, -1] = 0
    parent_rel[:, -1] = 0
    grand_rel = np.take_along_axis(parent_rel, np.concatenate([np.zeros((num_queries, 3), int), parent], 1), 1)
    is_answer = (hop[None, :] == 2) & (parent_rel == 0) & (grand_rel == 1)
    nodes = np.arange(num_queries * n, dtype=np.int64)
    answers = [nodes[q * n : (q + 1) * n][is_answer[q]] for q in range(num_queries)]
    answer_ptr = np.zeros(num_queries + 1, dtype=np.int64)
    answer_ptr[1:] = np.cumsum([len(a) for a in answers])
    edges_per_query = n - 3
    subgraphs = SubgraphSet(
        query_ids=np.arange(num_queries, dtype=np.int64),
        splits=np.array(["train"] * num_queries, dtype=object),
        node_ptr=np.arange(num_queries + 1, dtype=np.int64) * n,
        nodes=nodes,
        hop=np.tile(hop, num_queries),
        score=rng.random(num_queries * n).astype(np.float32),
        is_answer=is_answer.reshape(-1),
        path_end=np.zeros(num_queries * n, np.float32),
        edge_ptr=np.arange(num_queries + 1, dtype=np.int64) * edges_per_query,
        edge_src=parent.reshape(-1).astype(np.int32),
        edge_dst=np.tile(np.arange(3, n, dtype=np.int32), num_queries),
        edge_rel=relation.reshape(-1).astype(np.int32),
        answer_ptr=answer_ptr,
        answers=np.concatenate(answers),
    )
    node_features = rng.normal(size=(num_queries * n, dim)).astype(np.float32)
    node_features /= np.linalg.norm(node_features, axis=1, keepdims=True)
    relation_features = rng.normal(size=(2 * num_relations, dim)).astype(np.float32)
    query_features = rng.normal(size=(num_queries, dim)).astype(np.float32)
    return QueryData(node_features, relation_features, query_features, subgraphs)
