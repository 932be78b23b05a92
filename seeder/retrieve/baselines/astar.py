"""A*-style best-first search (paper, Appendix E).

States are nodes reached by a path from a dense seed. The path score g accumulates the beam's
transition score (w_dst * cos(q, v) + w_rel * cos(q, r) + discount * g(u) - hop penalty); the
priority is g + w_h * cos(q, v), a heuristic of how promising the node itself looks. The search
pops the highest priority, expands each node once, stops after ``astar.budget`` expansions and
does not expand beyond ``astar.depth`` hops. The queue is sequential by nature, so this loops per
query; each expansion scores all of a node's (capped) neighbours with one array operation.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from seeder.config import BaselinesConfig
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.baselines.beam import transition_weights
from seeder.retrieve.baselines.common import BaselineInputs, csr_expand, dense_seeds, full_ranking, in_batches


@dataclass
class SearchTrace:
    """One query's search: expanded nodes in expansion order, their priority, path score, parent, depth."""

    nodes: np.ndarray
    priority: np.ndarray
    path_score: np.ndarray
    parent: np.ndarray  # -1 for a seed
    depth: np.ndarray
    frontier: np.ndarray
    """Nodes generated but not expanded when the search stopped, best priority first (ties by id)."""
    frontier_priority: np.ndarray

    def path_to(self, node: int) -> list[int]:
        """The search's path from a seed to an expanded ``node``."""
        where = {int(v): i for i, v in enumerate(self.nodes)}
        path = [int(node)]
        while self.parent[where[path[-1]]] >= 0:
            path.append(int(self.parent[where[path[-1]]]))
        return path[::-1]


def astar_search(
    inputs: BaselineInputs, query_row: int, seeds: np.ndarray, seed_scores: np.ndarray, cfg: BaselinesConfig
) -> SearchTrace:
    """Best-first search for query row ``query_row`` from its seeds (-1 padded)."""
    w_dst, w_rel, _ = transition_weights(cfg)
    w_prev = cfg.astar.discount
    query = np.asarray(inputs.query_features[query_row], dtype=np.float32)
    relation_sim = np.asarray(inputs.relation_features, dtype=np.float32) @ query
    w_h = cfg.astar.heuristic_weight
    # heapq is a min-heap: push -priority; the node id breaks ties so the order is deterministic.
    heap = [(-(float(s) + w_h * float(s)), int(v), float(s), -1, 0) for v, s in zip(seeds, seed_scores) if v >= 0]
    heapq.heapify(heap)
    expanded: dict[int, tuple[float, float, int, int]] = {}
    while heap and len(expanded) < cfg.astar.budget:
        neg_priority, node, g, parent, depth = heapq.heappop(heap)
        if node in expanded:
            continue
        expanded[node] = (-neg_priority, g, parent, depth)
        if depth >= cfg.astar.depth:
            continue
        _, nbr, rel = csr_expand(inputs.graph, np.array([node]), cfg.ego.neighbor_cap)
        node_sim = np.asarray(inputs.node_features[nbr], dtype=np.float32) @ query
        child_g = w_dst * node_sim + w_rel * relation_sim[rel] + w_prev * g - cfg.beam.hop_penalty
        child_priority = child_g + w_h * node_sim
        for v, cg, cp in zip(nbr.tolist(), child_g.tolist(), child_priority.tolist()):
            if v not in expanded:
                heapq.heappush(heap, (-cp, v, cg, node, depth + 1))
    nodes = np.fromiter(expanded, dtype=np.int64, count=len(expanded))
    values = np.array(list(expanded.values()), dtype=np.float64).reshape(-1, 4)
    left = np.array([(-p, v) for p, v, *_ in heap if v not in expanded], dtype=np.float64).reshape(-1, 2)
    order = np.lexsort((left[:, 1], -left[:, 0]))
    _, first = np.unique(left[order, 1].astype(np.int64), return_index=True)  # best entry per node
    keep = np.sort(first)  # back to priority order
    return SearchTrace(
        nodes,
        values[:, 0],
        values[:, 1],
        values[:, 2].astype(np.int64),
        values[:, 3].astype(np.int64),
        left[order[keep], 1].astype(np.int64),
        left[order[keep], 0],
    )


def retrieve(inputs: BaselineInputs, cfg: BaselinesConfig, length: int) -> RetrievalResult:
    """Expanded nodes by priority (ties by node id): the retrieved set. Then the nodes left on the
    queue by their priority, then the rest by cosine."""

    def run(batch: BaselineInputs) -> RetrievalResult:
        seeds, seed_scores = dense_seeds(batch, cfg.seeds)
        traces = [astar_search(batch, i, seeds[i], seed_scores[i], cfg) for i in range(len(seeds))]
        width = max((len(t.nodes) + len(t.frontier) for t in traces), default=0)
        ranking = np.full((len(traces), width), -1, dtype=np.int64)
        counts = np.zeros(len(traces), dtype=np.int64)
        for i, t in enumerate(traces):
            order = np.lexsort((t.nodes, -t.priority))
            row = np.concatenate([t.nodes[order], t.frontier])
            ranking[i, : len(row)] = row
            counts[i] = len(order)
        return full_ranking(batch, ranking, counts, length)

    return in_batches(inputs, cfg.block_queries, run, length)
