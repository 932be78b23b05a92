"""G-Retriever, retrieval stage only (He et al. 2024; paper, Appendix E).

Dense seeds, a bounded 2-hop ego graph, node prizes k, k-1, ..., 1 for the top-k nodes by
node-query cosine, edge prizes from the cosine of the triple (mean of head, relation and tail
cosines) on the top-k distinct values, then a prize-collecting Steiner tree (pcst_fast, one
cluster, GW pruning). An edge whose prize exceeds its cost becomes a virtual node carrying the
surplus, as in G-Retriever. Selected nodes are ranked by cosine plus a prize bonus.

Prizes and the PCST inputs are built for the whole batch with array operations; only the
pcst_fast call runs per query.
"""

from __future__ import annotations

import numpy as np
import pcst_fast

from seeder.config import BaselinesConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.common import (
    BaselineInputs,
    EgoGraphs,
    dense_seeds,
    ego_graphs,
    full_ranking,
    group_rank,
    in_batches,
    pair_cosine,
    rank_candidates,
)

_BINDING_CHECKED = False


def check_pcst_binding() -> None:
    """Fail clearly on a pcst_fast build that returns garbage (pcst-fast 1.0.10 wheels under numpy 2).

    On the path 0-1-2 with prizes 3, 0, 3 and unit costs the optimum is the whole path.
    """
    global _BINDING_CHECKED
    if _BINDING_CHECKED:
        return
    vertices, edges = pcst_fast.pcst_fast(np.array([[0, 1], [1, 2]]), np.array([3.0, 0.0, 3.0]), np.ones(2), -1, 1, "gw", 0)
    if sorted(np.asarray(vertices).tolist()) != [0, 1, 2] or sorted(np.asarray(edges).tolist()) != [0, 1]:
        raise RuntimeError(
            f"pcst_fast at {pcst_fast.__file__} returns wrong results (vertices {list(vertices)}, edges {list(edges)} "
            "on a 3-node path); the pcst-fast 1.0.10 wheel is broken under numpy 2: "
            "`pip uninstall pcst-fast && pip install pcst-fast2` (same module, numpy-2 wheels)"
        )
    _BINDING_CHECKED = True


# G-Retriever shrinks each lower prize tier by this fraction so tiers stay strictly ordered.
TIER_SHRINK = 0.01


def node_prizes(ego: EgoGraphs, topk: int) -> np.ndarray:
    """topk, topk-1, ..., 1 for each query's best nodes by cosine (ties by node id), 0 elsewhere."""
    order, rank = group_rank(ego.query, ego.sim, ego.node)
    prizes = np.zeros(len(ego.node))
    top = rank < topk
    prizes[order[top]] = topk - rank[top]
    return prizes


def edge_prizes(edge_query: np.ndarray, similarity: np.ndarray, topk: int) -> np.ndarray:
    """G-Retriever's edge prizes: the k highest distinct similarity values of each query form tiers.

    Tier j (0 = best) holding c edges gives each min((k - j) / c, previous tier's value - 0.01),
    and the previous value then shrinks by 1%; all other edges get 0.
    """
    prizes = np.zeros(len(similarity))
    if not len(similarity):
        return prizes
    order = np.lexsort((-similarity, edge_query))
    q, s = edge_query[order], similarity[order]
    new_group = np.r_[True, q[1:] != q[:-1]]
    new_value = new_group | np.r_[True, s[1:] != s[:-1]]
    tier_global = np.cumsum(new_value) - 1
    tier = tier_global - tier_global[np.flatnonzero(new_group)][np.cumsum(new_group) - 1]
    in_top = tier < topk
    num_q = int(edge_query.max()) + 1
    counts = np.zeros((num_q, topk))
    np.add.at(counts, (q[in_top], tier[in_top]), 1.0)
    values = np.zeros((num_q, topk))
    last = np.full(num_q, float(topk))
    for j in range(topk):  # k tiers, each computed for every query at once
        has = counts[:, j] > 0
        value = np.minimum((topk - j) / np.maximum(counts[:, j], 1.0), last - TIER_SHRINK)
        values[has, j] = value[has]
        last = np.where(has, value * (1.0 - TIER_SHRINK), last)
    prizes[order[in_top]] = values[q[in_top], tier[in_top]]
    return prizes


def pcst_inputs(
    num_nodes: int,
    heads: np.ndarray,
    tails: np.ndarray,
    node_prize: np.ndarray,
    edge_prize: np.ndarray,
    edge_cost: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """G-Retriever's PCST instance: (edges [E', 2], vertex prizes, edge costs, cheap edge ids, rich edge ids).

    Edges with prize <= cost enter with cost - prize; each richer edge becomes a virtual vertex
    (num_nodes + j for the j-th rich edge) of prize (prize - cost) joined to its endpoints by free
    edges, so selecting the virtual vertex selects the edge.
    """
    cheap = np.flatnonzero(edge_prize <= edge_cost)
    rich = np.flatnonzero(edge_prize > edge_cost)
    virtual = num_nodes + np.arange(len(rich))
    edges = np.concatenate(
        [
            np.stack([heads[cheap], tails[cheap]], axis=1),
            np.stack([heads[rich], virtual], axis=1),
            np.stack([virtual, tails[rich]], axis=1),
        ]
    ).astype(np.int64)
    costs = np.concatenate([edge_cost - edge_prize[cheap], np.zeros(2 * len(rich))])
    prizes = np.concatenate([node_prize, edge_prize[rich] - edge_cost])
    return edges, prizes.astype(np.float64), costs.astype(np.float64), cheap, rich


def solve_pcst(
    num_nodes: int,
    heads: np.ndarray,
    tails: np.ndarray,
    node_prize: np.ndarray,
    edge_prize: np.ndarray,
    edge_cost: float,
    num_clusters: int,
    pruning: str,
) -> tuple[np.ndarray, np.ndarray]:
    """G-Retriever's PCST for one graph: (selected local nodes, selected local edges), both sorted.

    The nodes are the tree's real vertices plus both endpoints of every selected edge.
    """
    check_pcst_binding()
    edges, prizes, costs, cheap, rich = pcst_inputs(num_nodes, heads, tails, node_prize, edge_prize, edge_cost)
    vertices, chosen = pcst_fast.pcst_fast(edges, prizes, costs, -1, num_clusters, pruning, 0)
    vertices = np.asarray(vertices, dtype=np.int64)
    chosen = np.asarray(chosen, dtype=np.int64)
    selected_edges = np.concatenate([cheap[chosen[chosen < len(cheap)]], rich[vertices[vertices >= num_nodes] - num_nodes]])
    nodes = np.concatenate([vertices[vertices < num_nodes], heads[selected_edges], tails[selected_edges]])
    return np.unique(nodes), np.unique(selected_edges)


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """PCST-selected nodes by cosine + prize bonus; the retrieved set is the selected tree."""

    def run(batch: BaselineInputs) -> RetrievalResult:
        seeds, _ = dense_seeds(batch, cfg.seeds)
        ego = ego_graphs(batch, seeds, cfg.ego.hops, cfg.ego.neighbor_cap, cfg.ego.max_nodes)
        n_prize = node_prizes(ego, cfg.gretriever.topk_nodes)
        relation_sim = pair_cosine(batch.query_features, ego.edge_query, batch.relation_features, ego.edge_relation)
        triple_sim = (ego.sim[ego.edge_head] + relation_sim + ego.sim[ego.edge_tail]) / 3.0
        e_prize = edge_prizes(ego.edge_query, triple_sim, cfg.gretriever.topk_edges)
        edge_offsets = np.searchsorted(ego.edge_query, np.arange(ego.num_queries + 1))
        selected = []
        for qi in range(ego.num_queries):  # pcst_fast solves one graph per call
            lo, hi = ego.offsets[qi], ego.offsets[qi + 1]
            elo, ehi = edge_offsets[qi], edge_offsets[qi + 1]
            local, _ = solve_pcst(
                int(hi - lo),
                ego.edge_head[elo:ehi] - lo,
                ego.edge_tail[elo:ehi] - lo,
                n_prize[lo:hi],
                e_prize[elo:ehi],
                cfg.gretriever.edge_cost,
                cfg.gretriever.num_clusters,
                cfg.gretriever.pruning,
            )
            selected.append(local + lo)
        flat = np.concatenate(selected) if selected else np.zeros(0, dtype=np.int64)
        score = ego.sim[flat] + cfg.gretriever.prize_bonus * n_prize[flat]
        ranking, counts = rank_candidates(ego.num_queries, ego.query[flat], ego.node[flat], score)
        return full_ranking(batch, ranking, counts, length)

    return in_batches(inputs, cfg.block_queries, run, length)
