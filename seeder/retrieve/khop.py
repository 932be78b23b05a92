"""K-HOP-WITH-FILTERING (paper, Section 3): each query's bounded candidate subgraph.

Starting from the seeds (hop 0, scored by their cosine to the query), each hop h = 1..K scores the
one-hop frontier of the nodes selected so far, over both edge directions (inverse relations are
their own ids ``r + R`` in the CSR), with

    score(u) = w1 sim(q,u) + max over edges (v -r-> u), v selected, of [w2 sim(q,v) + w3 sim(q,r)]

and keeps the best ``keep_per_hop[h-1]`` nodes not selected yet (ties: smaller node id), never more
than ``budget`` nodes in total. The output keeps ids, scores and the induced edges, never embeddings.

Everything is vectorised over a batch of queries: (query, node) pairs live in flat arrays with keys
``query * N + node``; CSR slices are gathered with repeat/cumsum offsets. The sorts pack their keys
into one int64 and sort the values (``_packed_order``), which is several times faster than a lexsort
or a stable argsort and gives the same order: the max over incoming edges sorts (key, edge term
descending) and keeps each key's first entry (with the learned prior, an argsort of that key, which
carries each entry's trie node along); per-query top-b sorts (query, score descending,
candidate index), the index standing for the node id; induced edges sort (query, src, dst,
relation). Where the fields do not fit in 63 bits the long way (argsort, lexsort) is taken. Only
the hops are a Python loop.

Work caps, so that a hub costs no more than the cap:

- ``neighbor_cap``: of a node with more neighbours, a fixed-stride sample is scored: positions
  ``floor(j * degree / neighbor_cap)`` for ``j < neighbor_cap`` within its CSR slice (out-edges
  first, then in-edges, as stored). Deterministic and spread over the whole slice.
- ``candidate_cap``: per hop and query, edges are taken from the best source nodes first (sources
  in selection order) until the cap, so the weakest sources lose edges first; a source cut short
  keeps a prefix of its stride sample.

The max over the selected set is kept exact across hops without re-reading old sources: candidates
not selected at hop h carry their best edge term to hop h+1, where only edges out of the nodes
added at hop h are new (max over S_h = max(max over S_{h-1}, max over the new nodes)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from seeder.config import AUTO, ConfigError, ExpandConfig, RelationScore, SeederConfig, choices
from seeder.io import DataError
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.prior import OFF_PATH_TERM
from seeder.retrieve.registry import register
from seeder.subgraphs import SubgraphSet, _offsets, sorted_lookup

RELATION_SCORES = choices(RelationScore)

HEAVY_DEGREE = 256
"""Nodes with a larger degree are not scanned when collecting induced edges: their edges to other
selected nodes are looked up in a small sorted index instead (see ``GraphIndex``)."""


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(starts[i], starts[i] + lengths[i])``; also which range each entry is from."""
    owner = np.repeat(np.arange(len(starts)), lengths)
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)  # start minus output offset
    return np.arange(len(owner)) + shift[owner], owner


def _group_rank(sorted_groups: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (input sorted by group)."""
    n = len(sorted_groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_groups[1:] != sorted_groups[:-1]
    starts = np.flatnonzero(first)
    return np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))


def _descending_bits(values: np.ndarray) -> np.ndarray:
    """uint32-ranged int64 keys whose ascending order is ``values`` (float32) descending."""
    bits = (-(values.astype(np.float32)) + np.float32(0.0)).view(np.int32).astype(np.int64)  # -0.0 -> 0.0
    ascending = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # float order as signed ints
    return ascending + (1 << 31)


def _from_descending_bits(bits: np.ndarray) -> np.ndarray:
    """The float32 values whose ``_descending_bits`` are ``bits`` (its inverse, up to the sign of 0)."""
    ascending = bits - (1 << 31)
    signed = np.where(ascending < 0, ascending ^ 0x7FFFFFFF, ascending).astype(np.int32)
    return -signed.view(np.float32)


def _bits(count: int) -> int:
    """Bits needed to store the integers 0 .. count - 1."""
    return max(int(count) - 1, 0).bit_length()


def _packed_keys(fields: list[tuple[np.ndarray, int]]) -> np.ndarray | None:
    """int64 keys packing non-negative ``fields`` (array, bits), most significant first, whose order
    is the lexicographic order of the fields (read back with shifts). None when they do not fit in
    63 bits (the caller then sorts the long way)."""
    if sum(bits for _, bits in fields) > 63:
        return None
    packed = np.zeros(len(fields[0][0]), dtype=np.int64)
    for values, bits in fields:
        packed <<= bits
        packed |= values
    return packed


def _packed_order(fields: list[tuple[np.ndarray, int]]) -> np.ndarray | None:
    """``_packed_keys`` sorted: the lexicographic order of the fields, several times faster than
    ``np.lexsort`` or a stable argsort (np.sort, SIMD, no permutation array)."""
    packed = _packed_keys(fields)
    return None if packed is None else np.sort(packed)


FREQUENT_SHARE = 16
"""A candidate node present in at least 1/16 of a batch's queries is scored by matrix product."""

COSINE_CHUNK = 512
"""Pairs ``node_query_cosines`` gathers at a time. At d = 256 a chunk's node rows and query rows take
2 x 512 KB, which stay in a core's L2 cache for the product that reads them back. Chunks of 2,048 pairs
(4 MB) did not: on this 2-core VM (2 MB of L2 a core) node cosines took 43 against 54 ms per 128
MetaQA questions, and ``bench_expand.py`` ran at 903-907 against 826-849 subgraphs/s/core. Each pair's
sum is the same einsum row whatever the chunk, so the cosines are bit-identical."""


def node_query_cosines(
    node_features: np.ndarray,
    nodes: np.ndarray,
    query_features: np.ndarray,
    rows: np.ndarray,
    chunk: int = COSINE_CHUNK,
    share_frequent: bool = True,
) -> np.ndarray:
    """cos(node ``nodes[i]``, query row ``rows[i]``) for flat pairs, gathered a chunk at a time.

    Gathering all rows at once would allocate (and page-fault) a [pairs, d] copy that can reach
    gigabytes; chunks that stay in cache (``COSINE_CHUNK``) are several times faster. The two
    paths (matrix product, gathered rows) agree to float32 rounding (~1e-7), so a near-tie between
    two candidates may resolve differently with another ``expand.batch_queries``.
    """
    out = np.empty(len(nodes), dtype=np.float32)
    num_q = len(query_features)
    if share_frequent and len(nodes) > 4 * num_q:
        # Nodes shared by many queries of the batch (a hub's fixed neighbour sample) are scored
        # against every query with one matrix product instead of one gathered row per pair.
        num_nodes = len(node_features)
        by_count = num_nodes <= 16 * len(nodes)  # a count per graph node is cheaper than sorting the pairs
        least = -(-num_q // FREQUENT_SHARE)  # pairs of a node present in >= 1/FREQUENT_SHARE of the queries
        if by_count:
            frequent_nodes = np.flatnonzero(np.bincount(nodes, minlength=num_nodes) >= least)
        else:
            uniq, counts = np.unique(nodes, return_counts=True)
            frequent_nodes = uniq[counts >= least]
        if len(frequent_nodes):
            if by_count:  # a slot per graph node: one gather, no binary search
                slot_of = np.full(num_nodes, -1, dtype=np.int32)
                slot_of[frequent_nodes] = np.arange(len(frequent_nodes), dtype=np.int32)
                slot = slot_of[nodes]
                is_shared = slot >= 0
            else:
                slot = np.minimum(np.searchsorted(frequent_nodes, nodes), len(frequent_nodes) - 1)
                is_shared = frequent_nodes[slot] == nodes
            # Integer positions into the flat [frequent, Q] table: boolean masks applied three times
            # over the pairs cost more than the product itself (a third of this call at 1M nodes).
            shared, rest = np.flatnonzero(is_shared), np.flatnonzero(~is_shared)
            table = np.asarray(np.take(node_features, frequent_nodes, axis=0), dtype=np.float32) @ query_features.T
            flat = np.take(slot, shared).astype(np.int64) * num_q + np.take(rows, shared)
            out[shared] = np.take(table.ravel(), flat)
            out[rest] = node_query_cosines(node_features, np.take(nodes, rest), query_features, np.take(rows, rest), chunk, False)
            return out
    for lo in range(0, len(nodes), chunk):
        hi = lo + chunk
        # np.take, not fancy indexing: the same rows, 15-35% faster for whole rows of a 2-D array.
        gathered = np.asarray(np.take(node_features, nodes[lo:hi], axis=0), dtype=np.float32)
        out[lo:hi] = np.einsum("ij,ij->i", gathered, np.take(query_features, rows[lo:hi], axis=0))
    return out


@dataclass
class GraphIndex:
    """The CSR arrays plus a sorted index of heavy nodes' out-edges, built once per expansion run.

    Induced edges are found by scanning the CSR slice of every light selected node (degree <=
    ``HEAVY_DEGREE``): its out-edges to selected nodes, and its in-edges from selected heavy nodes.
    Edges between two heavy nodes come from ``heavy_keys`` (heavy rank * N + out-neighbour, sorted),
    so a hub in a subgraph costs a binary search per selected heavy pair, not a scan of its slice.
    """

    indptr: np.ndarray
    neighbors: np.ndarray
    relations: np.ndarray
    num_nodes: int
    num_relations: int
    heavy_nodes: np.ndarray  # sorted ids of nodes with degree > HEAVY_DEGREE
    heavy_mask: np.ndarray  # bool [N]
    heavy_keys: np.ndarray  # int64, sorted
    heavy_rel: np.ndarray  # int32, relation of each heavy_keys entry

    @classmethod
    def build(cls, kg, heavy_degree: int = HEAVY_DEGREE) -> "GraphIndex":
        indptr = np.asarray(kg.indptr)
        num_nodes = kg.num_nodes
        degree = np.diff(indptr)
        heavy = np.flatnonzero(degree > heavy_degree)
        pos, owner = _ranges(indptr[heavy], degree[heavy])
        rel = np.asarray(kg.edge_relations[pos])
        out = rel < kg.num_relations
        keys = owner[out].astype(np.int64) * num_nodes + np.asarray(kg.neighbors[pos[out]], dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        return cls(
            indptr=indptr,
            neighbors=kg.neighbors,
            relations=kg.edge_relations,
            num_nodes=num_nodes,
            num_relations=kg.num_relations,
            heavy_nodes=heavy,
            heavy_mask=degree > heavy_degree,
            heavy_keys=keys[order],
            heavy_rel=rel[out][order].astype(np.int32),
        )

    def is_heavy(self, nodes: np.ndarray) -> np.ndarray:
        return self.heavy_mask[nodes]


class _Clock:
    """Adds the CPU seconds since the previous call to ``timings[phase]`` (no-op without a dict)."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.last = time.process_time()

    def __call__(self, phase: str) -> None:
        if self.timings is not None:
            now = time.process_time()
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
            self.last = now


def _check_config(cfg: ExpandConfig) -> None:
    if cfg.hops < 0 or (cfg.hops == 0 and cfg.keep_per_hop):
        # 0 (auto) is resolved by pipelines/preprocess.py, whose artifacts hold the derived value.
        raise ConfigError(
            f"expand.hops must be >= 1 here, got {cfg.hops}; hops=0 (auto) is derived only by pipelines/preprocess.py, "
            f"so leave expand.hops out to use the artifacts' value"
        )
    if len(cfg.keep_per_hop) != cfg.hops:
        raise ConfigError(
            f"expand.keep_per_hop has {len(cfg.keep_per_hop)} entries but expand.hops={cfg.hops}; give one per hop"
        )
    if len(cfg.weights) != 3:
        raise ConfigError(f"expand.weights needs 3 values (w1 sim(q,u), w2 sim(q,v), w3 sim(q,r)), got {cfg.weights}")
    if cfg.relation_score == AUTO:
        raise ConfigError("expand.relation_score=auto is resolved by preprocessing (seeder.derive); expand with the resolved config")
    if cfg.budget < 1 or cfg.neighbor_cap < 1 or cfg.candidate_cap < 1 or min(cfg.keep_per_hop, default=0) < 0:
        raise ConfigError("expand.budget, neighbor_cap and candidate_cap must be positive, keep_per_hop >= 0")


def _rank_order(uq: np.ndarray, score: np.ndarray, num_q: int) -> np.ndarray:
    """Indices of the candidates by (query, score descending, index); ties keep index order.

    Candidates are indexed in (query, node) order, so index order is node-id order within a query.
    """
    index_bits = _bits(len(uq))
    packed = _packed_order([(uq, _bits(num_q)), (_descending_bits(score), 32), (np.arange(len(uq)), index_bits)])
    if packed is None:
        return np.argsort((uq << 32) | _descending_bits(score), kind="stable")
    return packed & ((1 << index_bits) - 1)


def expand_batch(
    graph: GraphIndex,
    node_features: np.ndarray,
    relation_features: np.ndarray,
    query_features: np.ndarray,
    seeds: np.ndarray,
    cfg: ExpandConfig,
    timings: dict[str, float] | None = None,
    path_terms: np.ndarray | None = None,
    trie_children: np.ndarray | None = None,
    end_terms: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """K-HOP-WITH-FILTERING for one batch of queries.

    Returns flat arrays ordered by (query row, selection order): ``query`` (row in the batch),
    ``nodes``, ``hop``, ``score``, ``path_end``, ``node_ptr`` [Qb+1], and the induced edges ``edge_ptr``,
    ``edge_src``/``edge_dst`` (local indices) and ``edge_rel`` (base relation). ``timings``, when
    given, accumulates seconds per phase (for benchmarks).

    With ``expand.relation_score: learned``, ``path_terms`` [Qb, T] and ``trie_children`` [T, 2R] come
    from the relation-path prior (seeder.retrieve.prior): each selected node remembers the trie node of
    its best path from the seed, and the w3 term of an edge v -r-> u is the path term of
    ``trie_children[path(v), r]`` (``OFF_PATH_TERM`` off the trie) instead of sim(q, r). A selected
    node's ``path_end`` is ``end_terms`` [Qb, T] at its path's trie node (0 with the cosine score).
    """
    clock = _Clock(timings)
    learned = cfg.relation_score == "learned"
    if learned and (path_terms is None or trie_children is None or end_terms is None):
        raise ConfigError("expand.relation_score=learned needs the relation-path prior's path terms; rerun preprocessing")
    n = graph.num_nodes
    w1, w2, w3 = (np.float32(w) for w in cfg.weights)
    num_q = len(query_features)
    query_features = np.asarray(query_features, dtype=np.float32)
    rel_sims = query_features @ np.asarray(relation_features, dtype=np.float32).T  # [Qb, 2R]

    # Hop 0: the seeds, de-duplicated per query (first occurrence wins), at most `budget`.
    q, col = np.nonzero(seeds >= 0)
    seed_ids = seeds[q, col].astype(np.int64)
    if len(seed_ids) and (seed_ids.max() >= n):
        raise DataError(f"seed id {int(seed_ids.max())} is not a node of the graph (N={n}); recompute the seeds")
    order = np.lexsort((col, seed_ids, q))
    keys = q[order] * n + seed_ids[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    order = np.sort(order[first])  # back to (query, column) order
    q, seed_ids = q[order], seed_ids[order]
    keep = _group_rank(q) < cfg.budget
    q, seed_ids = q[keep], seed_ids[keep]
    sims = node_query_cosines(node_features, seed_ids, query_features, q)
    sel_q, sel_node, sel_hop, sel_score, sel_sim = [q], [seed_ids], [np.zeros(len(q), np.int8)], [sims], [sims]
    sel_trie = [np.zeros(len(q), np.int64)]  # learned: trie node of each selected node's path (seeds: the root)
    sel_count = np.bincount(q, minlength=num_q)
    selected_keys = np.sort(q * n + seed_ids)
    selected_anywhere = np.zeros(n, dtype=bool)  # selected by some query of the batch
    selected_anywhere[seed_ids] = True

    clock("seeds")
    src_q, src_node, src_sim = q, seed_ids, sims  # sources of the next hop: the newest nodes
    carry_keys = np.zeros(0, np.int64)  # candidates seen but not selected, sorted by key
    carry_edge = np.zeros(0, np.float32)  # their best w2 sim(q,v) + w3 sim(q,r) so far
    carry_sim = np.zeros(0, np.float32)  # their sim(q,u)
    src_trie = np.zeros(len(q), np.int64)  # learned: trie node of each source's path (seeds: the root)
    for h in range(1, cfg.hops + 1):
        # Gather capped CSR slices of the sources (sources sorted by query, best first).
        start = graph.indptr[src_node]
        degree = graph.indptr[src_node + 1] - start
        sample = np.minimum(degree, cfg.neighbor_cap)
        before = np.cumsum(sample) - sample
        within_query = before - before[np.searchsorted(src_q, src_q)]
        # The candidate cap keeps a prefix of each node's sample, so a node's sample never depends
        # on the other sources.
        take = np.clip(np.minimum(sample, cfg.candidate_cap - within_query), 0, None)
        j, owner = _ranges(np.zeros(len(take), np.int64), take)
        pos = start[owner] + (j * degree[owner]) // np.maximum(sample[owner], 1)
        nbr = np.asarray(graph.neighbors[pos], dtype=np.int64)
        rel = np.asarray(graph.relations[pos], dtype=np.int64)
        eq = src_q[owner]
        if learned:
            parent = src_trie[owner]
            child = np.where(parent >= 0, trie_children[np.maximum(parent, 0), rel], -1).astype(np.int64)
            path_term = np.where(child >= 0, path_terms[eq, np.maximum(child, 0)], OFF_PATH_TERM)
            edge_term = w2 * src_sim[owner] + w3 * path_term
        else:
            child = np.zeros(0, np.int64)
            edge_term = w2 * src_sim[owner] + w3 * rel_sims[eq, rel]
        clock("gather")
        cand_keys = eq * n + nbr
        fresh = np.ones(len(cand_keys), dtype=bool)
        maybe = np.flatnonzero(selected_anywhere[nbr])  # cheap bitmap test first
        fresh[maybe] = ~sorted_lookup(selected_keys, cand_keys[maybe])[0]
        # Max over incoming (v, r) per (query, node), merged with the carried candidates.
        all_keys = np.concatenate([carry_keys, cand_keys[fresh]])
        all_edge = np.concatenate([carry_edge, edge_term[fresh].astype(np.float32)])
        key_and_edge = [(all_keys, _bits(n * num_q)), (_descending_bits(all_edge), 32)]
        if learned:
            # The permutation carries each entry's trie node along (an argsort of one packed key, not
            # a lexsort of three arrays). Among a key's entries tied at its best edge term, the
            # smallest trie node names the path. (Nothing is carried in this mode, see below.)
            all_trie = child[fresh]
            packed = _packed_keys(key_and_edge)
            if packed is not None:
                order = np.argsort(packed)
                packed, all_trie = packed[order], all_trie[order]
                all_keys = packed >> 32
            else:
                order = np.lexsort((all_trie, -all_edge, all_keys))
                all_keys, all_edge, all_trie = all_keys[order], all_edge[order], all_trie[order]
        else:
            # (key, edge term descending) packed in one int64: the first entry of a key is its max.
            packed = _packed_order(key_and_edge)
            if packed is None:
                order = np.argsort(all_keys)  # the max below does not care about the order of equal keys
                all_keys, all_edge = all_keys[order], all_edge[order]
            else:
                all_keys = packed >> 32
        if len(all_keys) == 0:
            break
        first = np.ones(len(all_keys), dtype=bool)
        first[1:] = all_keys[1:] != all_keys[:-1]
        starts = np.flatnonzero(first)
        ukeys = all_keys[starts]
        if packed is not None:
            best_edge = _from_descending_bits(packed[starts] & 0xFFFFFFFF)
        else:
            best_edge = all_edge[starts] if learned else np.maximum.reduceat(all_edge, starts)
        if learned and packed is not None:
            # Runs of equal (key, edge term): the smallest trie node of each key's first run.
            run = np.ones(len(packed), dtype=bool)
            run[1:] = packed[1:] != packed[:-1]
            runs = np.flatnonzero(run)
            best_trie = np.minimum.reduceat(all_trie, runs)[first[runs]]
        elif learned:
            best_trie = all_trie[starts]
        uq, unode = ukeys // n, ukeys % n
        clock("max per node")
        # Carried candidates keep their cosine. Every carried key is among ukeys, so the few carried
        # keys are searched in ukeys (not every candidate in the carried ones).
        usim = np.empty(len(ukeys), dtype=np.float32)
        new = np.ones(len(ukeys), dtype=bool)
        where = np.searchsorted(ukeys, carry_keys)
        usim[where], new[where] = carry_sim, False
        usim[new] = node_query_cosines(node_features, unode[new], query_features, uq[new])
        clock("node cosines")
        score = w1 * usim + best_edge
        # Per-query top b_h by (score desc, id asc), within the remaining budget.
        # ukeys are sorted by (query, node), so a stable sort on (query, -score) breaks ties by id.
        rank_order = _rank_order(uq, score, num_q)
        rank = _group_rank(uq[rank_order])
        limit = np.minimum(cfg.keep_per_hop[h - 1], cfg.budget - sel_count)
        chosen = rank_order[rank < limit[uq[rank_order]]]  # (query, best first)
        sel_q.append(uq[chosen]), sel_node.append(unode[chosen])
        sel_hop.append(np.full(len(chosen), h, np.int8)), sel_score.append(score[chosen]), sel_sim.append(usim[chosen])
        sel_count += np.bincount(uq[chosen], minlength=num_q)
        selected_keys = np.sort(np.concatenate([selected_keys, ukeys[chosen]]))
        selected_anywhere[unode[chosen]] = True
        if learned:
            # Path terms shrink with depth (a prefix's mass includes all its continuations), so a
            # candidate passed over at hop h would outrank every hop h+1 candidate: it is not carried.
            src_trie = best_trie[chosen]
            sel_trie.append(src_trie)
        elif h < cfg.hops:  # after the last hop nothing is carried
            rest = np.ones(len(ukeys), dtype=bool)
            rest[chosen] = False
            carry_keys, carry_edge, carry_sim = ukeys[rest], best_edge[rest], usim[rest]
        src_q, src_node = uq[chosen], unode[chosen]
        src_sim = score[chosen] if cfg.parent_term == "score" else usim[chosen]
        clock("top-b")

    q = np.concatenate(sel_q)
    order = np.argsort(q, kind="stable")  # by query; hops and best-first order kept within
    out = {
        "query": q[order],
        "nodes": np.concatenate(sel_node)[order],
        "hop": np.concatenate(sel_hop)[order],
        "score": np.concatenate(sel_score)[order].astype(np.float32),
    }
    if learned:
        trie = np.concatenate(sel_trie)[order]
        out["path_end"] = np.where(trie >= 0, end_terms[out["query"], np.maximum(trie, 0)], OFF_PATH_TERM).astype(np.float32)
    else:
        out["path_end"] = np.zeros(len(out["nodes"]), np.float32)
    out["node_ptr"] = _offsets(np.bincount(out["query"], minlength=num_q))
    out.update(induced_edges(graph, out["query"], out["nodes"], out["node_ptr"]))
    clock("induced edges")
    return out


def induced_edges(graph: GraphIndex, query: np.ndarray, nodes: np.ndarray, node_ptr: np.ndarray) -> dict[str, np.ndarray]:
    """Every directed KG edge among each query's selected nodes, once, as local indices + base relation."""
    n, num_rel = graph.num_nodes, graph.num_relations
    num_q = len(node_ptr) - 1
    local = np.arange(len(nodes)) - node_ptr[query]
    sel_keys = query * n + nodes
    key_order = np.argsort(sel_keys)
    sorted_keys, sorted_local = sel_keys[key_order], local[key_order]
    heavy = graph.is_heavy(nodes)

    # Light nodes: scan their slices. A bitmap of the batch's selected nodes rejects most entries
    # first, so everything after it (relations, keys, binary search) runs on the few that remain.
    light = np.flatnonzero(~heavy)
    start = graph.indptr[nodes[light]]
    pos, owner = _ranges(start, graph.indptr[nodes[light] + 1] - start)
    in_batch = np.zeros(n, dtype=bool)
    in_batch[nodes] = True
    maybe = np.flatnonzero(in_batch[graph.neighbors[pos]])
    pos, owner = pos[maybe], owner[maybe]
    nbr = np.asarray(graph.neighbors[pos], dtype=np.int64)
    rel = np.asarray(graph.relations[pos], dtype=np.int64)
    eq = query[light][owner]
    found, where = sorted_lookup(sorted_keys, eq * n + nbr)
    other_local = sorted_local[where]
    out_edge = found & (rel < num_rel)
    in_from_heavy = found & (rel >= num_rel) & graph.is_heavy(nbr)
    this_local = local[light][owner]
    parts = [
        (eq[out_edge], this_local[out_edge], other_local[out_edge], rel[out_edge]),
        (eq[in_from_heavy], other_local[in_from_heavy], this_local[in_from_heavy], rel[in_from_heavy] - num_rel),
    ]

    # Heavy -> heavy: every ordered pair of a query's heavy nodes (self-loops included), looked up.
    hv = np.flatnonzero(heavy)
    if len(hv):
        hq = query[hv]
        counts = np.bincount(hq, minlength=num_q)
        hptr = _offsets(counts)
        per = counts[hq]
        a_idx, a_owner = _ranges(np.zeros(len(hv), np.int64), per)  # partner index within the query
        a = hv[a_owner]
        b = hv[hptr[hq[a_owner]] + a_idx]
        rank_a = np.searchsorted(graph.heavy_nodes, nodes[a])
        lookup = rank_a * n + nodes[b]
        lo = np.searchsorted(graph.heavy_keys, lookup, side="left")
        hi = np.searchsorted(graph.heavy_keys, lookup, side="right")
        epos, eowner = _ranges(lo, hi - lo)
        parts.append((query[a][eowner], local[a][eowner], local[b][eowner], graph.heavy_rel[epos].astype(np.int64)))

    eq, src, dst, rel = (np.concatenate([p[i] for p in parts]) for i in range(4))
    # One row per distinct (query, src, dst, relation), sorted: duplicate KG edges collapse.
    local_bits = _bits(int(np.diff(node_ptr).max(initial=0)))
    widths = [_bits(num_q), local_bits, local_bits, _bits(num_rel)]
    packed = _packed_order(list(zip((eq, src, dst, rel), widths)))
    if packed is not None:
        packed = packed[np.append(True, packed[1:] != packed[:-1])[: len(packed)]]  # sorted: drop repeats
        shifts = np.cumsum(widths[::-1])[::-1] - widths  # where each field starts, from the right
        eq, src, dst, rel = ((packed >> int(shift)) & ((1 << bits) - 1) for shift, bits in zip(shifts, widths))
    else:
        order = np.lexsort((rel, dst, src, eq))
        eq, src, dst, rel = eq[order], src[order], dst[order], rel[order]
        first = np.ones(len(eq), dtype=bool)
        first[1:] = (np.diff(eq) != 0) | (np.diff(src) != 0) | (np.diff(dst) != 0) | (np.diff(rel) != 0)
        eq, src, dst, rel = eq[first], src[first], dst[first], rel[first]
    return {
        "edge_ptr": _offsets(np.bincount(eq, minlength=num_q)),
        "edge_src": src.astype(np.int32),
        "edge_dst": dst.astype(np.int32),
        "edge_rel": rel.astype(np.int32),
    }


def expand_queries(
    kg,
    node_features: np.ndarray,
    relation_features: np.ndarray,
    query_features: np.ndarray,
    seeds: np.ndarray,
    seed_scores: np.ndarray,
    expand_config: ExpandConfig,
    query_ids: np.ndarray,
    splits: np.ndarray,
    answer_ptr: np.ndarray,
    answers: np.ndarray,
    graph: GraphIndex | None = None,
    progress=None,
    prior=None,
    texts: list[str] | None = None,
) -> SubgraphSet:
    """K-HOP-WITH-FILTERING for Q queries -> their bounded subgraphs (one ``SubgraphSet`` row each).

    ``seeds`` is [Q, k0] padded with -1. Hop-0 scores are the seeds' cosines to the query, recomputed
    from the features (``seed_scores`` may hold NaN for entity-linked seeds; it is not trusted).
    Queries are expanded ``expand.batch_queries`` at a time; ``progress(done)`` is called after each
    batch. Pass a prebuilt ``graph`` (``GraphIndex.build(kg)``) to share it across calls, and the
    ``prior`` (a ``RelationPathPrior``) when ``expand.relation_score`` is ``learned``, with the
    queries' ``texts`` when that prior reads their wording.
    """
    _check_config(expand_config)
    seeds = np.asarray(seeds, dtype=np.int64)
    num_q = len(query_ids)
    if seeds.ndim != 2 or len(seeds) != num_q or len(query_features) != num_q or len(answer_ptr) != num_q + 1:
        raise ValueError(
            f"expand_queries: seeds {seeds.shape}, query_features {len(query_features)} rows and answer_ptr "
            f"{len(answer_ptr)} entries do not match {num_q} query ids"
        )
    if len(relation_features) != 2 * kg.num_relations:
        raise DataError(
            f"relation features have {len(relation_features)} rows, expected 2R = {2 * kg.num_relations} "
            "(base relations, then inverses); recompute the features stage"
        )
    graph = graph or GraphIndex.build(kg)
    answer_ptr = np.asarray(answer_ptr, dtype=np.int64)
    answers = np.asarray(answers, dtype=np.int64)
    chunks = []
    step = max(expand_config.batch_queries, 1)
    for lo in range(0, num_q, step):
        hi = min(lo + step, num_q)
        terms = ends = children = None
        if expand_config.relation_score == "learned":
            from seeder.retrieve.prior import seed_relation_profile
            from seeder.retrieve.wording import seed_names

            if prior is None:
                raise ConfigError("expand.relation_score=learned needs the relation-path prior; run preprocessing")
            profile = seed_relation_profile(graph.indptr, graph.relations, seeds[lo:hi], 2 * graph.num_relations)
            names = seed_names(kg.nodes.column("name"), seeds[lo:hi]) if prior.wording_dim else None
            inputs = prior.inputs(query_features[lo:hi], profile, None if texts is None else list(texts[lo:hi]), names)
            (terms, ends), children = prior.path_terms(inputs), prior.trie.children
        chunks.append(
            expand_batch(graph, node_features, relation_features, query_features[lo:hi], seeds[lo:hi], expand_config,
                         path_terms=terms, trie_children=children, end_terms=ends)
        )
        if progress is not None:
            progress(hi)

    def cat(name: str, dtype) -> np.ndarray:
        return np.concatenate([c[name] for c in chunks]).astype(dtype) if chunks else np.zeros(0, dtype)

    def cat_ptr(name: str) -> np.ndarray:
        return _offsets(np.concatenate([np.diff(c[name]) for c in chunks]) if chunks else np.zeros(0, np.int64))

    node_ptr = cat_ptr("node_ptr")
    nodes = cat("nodes", np.int64)
    query_of_node = np.repeat(np.arange(num_q), np.diff(node_ptr))
    answer_keys = np.unique(np.repeat(np.arange(num_q), np.diff(answer_ptr)) * kg.num_nodes + answers)
    return SubgraphSet(
        query_ids=np.asarray(query_ids, dtype=np.int64),
        splits=np.asarray(splits, dtype=object),
        node_ptr=node_ptr,
        nodes=nodes,
        hop=cat("hop", np.int8),
        score=cat("score", np.float32),
        is_answer=sorted_lookup(answer_keys, query_of_node * kg.num_nodes + nodes)[0],
        path_end=cat("path_end", np.float32),
        edge_ptr=cat_ptr("edge_ptr"),
        edge_src=cat("edge_src", np.int32),
        edge_dst=cat("edge_dst", np.int32),
        edge_rel=cat("edge_rel", np.int32),
        answer_ptr=answer_ptr,
        answers=answers,
    )


# ---------------------------------------------------------------------------------------------------
# The K-HOP-W-FILTER reference retriever


def khop_ranking(subgraphs: SubgraphSet, dense_ids: np.ndarray, length: int) -> RetrievalResult:
    """Rank each subgraph by filter score (ties: smaller id), then continue with the dense order of
    the nodes outside it, up to ``length`` entries; the retrieved set is the subgraph.

    ``dense_ids`` [Q, L'] is the dense ranking; with L' >= length + budget the rows are always full
    (as far as the graph has nodes).
    """
    num_q = len(subgraphs)
    owner = np.repeat(np.arange(num_q), subgraphs.sizes)
    order = np.lexsort((subgraphs.nodes, -subgraphs.score, owner))
    sub_q, sub_nodes = owner[order], subgraphs.nodes[order]
    sub_prio = _group_rank(sub_q)
    dq, dcol = np.nonzero(dense_ids >= 0)
    d_nodes = dense_ids[dq, dcol]
    base = int(max(d_nodes.max(initial=-1), sub_nodes.max(initial=-1))) + 1
    outside = ~sorted_lookup(np.sort(sub_q * base + sub_nodes), dq * base + d_nodes)[0]
    q = np.concatenate([sub_q, dq[outside]])
    prio = np.concatenate([sub_prio, dcol[outside] + base])  # subgraph first, then dense order
    nodes = np.concatenate([sub_nodes, d_nodes[outside]])
    order = np.lexsort((prio, q))
    q, nodes = q[order], nodes[order]
    rank = _group_rank(q)
    keep = rank < length
    ranking = np.full((num_q, length), -1, dtype=np.int64)
    ranking[q[keep], rank[keep]] = nodes[keep]
    return RetrievalResult(
        query_ids=subgraphs.query_ids.copy(),
        ranking=ranking,
        set_size=np.minimum(subgraphs.sizes, length).astype(np.int64),
    )


@dataclass
class KHopRetriever:
    node_features: np.ndarray
    config: SeederConfig

    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult:
        from seeder.retrieve.dense import dense_ranking, ranking_length

        length = ranking_length(self.config)
        width = length + int(subgraphs.sizes.max(initial=0))
        dense_ids = dense_ranking(query_features, self.node_features, width, self.config)
        return khop_ranking(subgraphs, dense_ids, length)


@register("khop")
def build_khop(artifacts, config: SeederConfig, model: str | None = None) -> KHopRetriever:
    return KHopRetriever(node_features=artifacts.node_features, config=config)
