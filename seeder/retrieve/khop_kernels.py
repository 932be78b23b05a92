"""Compiled K-HOP-WITH-FILTERING (paper, Section 3): each query's hops in one pass.

``seeder.retrieve.khop`` describes the method and its caps; this module is its per-query loop.
Vectorised over a batch in numpy, each hop took some twenty passes over flat (query, node) arrays
(packed-key sorts, gathers, binary searches) and copied every candidate's feature row before its dot
product. Here a query's candidates live in a small open-addressing table (a few thousand entries,
so it stays in the core's cache whatever the graph's size), each sampled edge is scored once, and
each candidate's cosine reads its feature row in place: the work is the edges scored plus one row
per candidate, nothing per graph node. Rows and CSR slices are prefetched a few ahead, since on a
large graph most of them are misses to memory.

Scores are float32 throughout, as in the numpy version. Ties between candidates are broken by the
smaller node id through a packed int64 key (``descending_keys``), so node ids must be below 2^32.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, overload

_INITIAL_CAPACITY = 4096
"""Candidate slots allocated per call before the first query; grown (doubled) when a hop needs more."""

_HOP_SPREAD = 4
"""Table entries per candidate slot of a hop (at most a quarter full)."""

_INDUCED_SPREAD = 8
"""Table entries per selected node when collecting induced edges: most neighbours scanned are not
selected, and at 1/8 full their probe mostly ends at the first entry read."""

_ROWS_AHEAD = 16
"""Feature rows requested ahead of the one being read: a candidate's row is mostly a miss to memory
on a large graph, and with several requests in flight their latencies overlap. The whole row is
requested (``_prefetch_row``), into L2: faster than requesting a row's first lines only, and 8-24 ahead
are alike (benchmarks/RESULTS.md, "Prefetching feature rows")."""

_SLICES_AHEAD = 4
"""CSR slices requested ahead of the one being scanned (as ``_ROWS_AHEAD``); a node's offsets in
``indptr`` are requested this many nodes before its slice."""

_NODE_BITS = 32
_NODE_MASK = (1 << _NODE_BITS) - 1


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the CPU to load the cache line of ``array[index]`` (1-D) into L2 without waiting for it
    (``llvm.prefetch``, read, locality 2). numba has no prefetch of its own; without one, a loop that
    reads scattered rows waits for each miss in turn."""
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_ptr = ir.IntType(8).as_pointer()
        int32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, int32, int32, int32]), "llvm.prefetch.p0"
        )
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_ptr)
        builder.call(fn, [address, int32(0), int32(2), int32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _prefetch_row(row: np.ndarray) -> None:
    """Prefetch every cache line of a contiguous feature row (see ``_ROWS_AHEAD``)."""
    step = max(64 // row.itemsize, 1)
    for i in range(0, row.shape[0], step):
        _prefetch(row, i)


@njit(cache=True, nogil=True, inline="always")
def _mix(node: int) -> int:
    """Scrambled node id for the table position: CSR neighbour lists are often runs of nearby ids,
    which linear probing on the raw id would pile into long clusters."""
    h = node ^ (node >> 16)
    h = (h & 0xFFFFFFFF) * 0x45D9F3B
    h ^= h >> 16
    return h


@njit(cache=True, nogil=True, inline="always")
def _probe(table: np.ndarray, mask: int, slot_node: np.ndarray, node: int) -> int:
    """Position of ``node`` in the open-addressing ``table`` (slot ids, -1 empty), or of the empty
    entry where it belongs. Linear probing, in a table kept sparse (``_table_size``)."""
    i = _mix(node) & mask
    while True:
        s = table[i]
        if s < 0 or slot_node[s] == node:
            return i
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _table_size(room: int, spread: int) -> int:
    """Power of two >= ``spread`` * ``room`` (and >= 64): the table is at most 1/spread full, so a
    probe for an absent node mostly ends at its first entry (short, predictable probes)."""
    size = 64
    while size < spread * room:
        size *= 2
    return size


@njit(cache=True, nogil=True)
def _reset_table(table: np.ndarray, slot_node: np.ndarray, count: int, room: int, spread: int) -> int:
    """Clear the table's used prefix, ``_table_size(room, spread)`` entries, and re-insert slots
    0..count-1; returns the new mask. Only that prefix is touched, so a query with few candidates
    pays for a small table, not for the largest one seen."""
    size = _table_size(room, spread)
    mask = size - 1
    table[:size] = -1
    for s in range(count):
        table[_probe(table, mask, slot_node, slot_node[s])] = s
    return mask


@intrinsic
def _bfloat16_bits_to_float32(typingctx, bits):
    """The float32 whose upper 16 bits are ``bits`` (uint16) and whose lower 16 are zero: a bfloat16
    value widened exactly (``seeder.features.bfloat16``)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return sig, codegen


def _widen(value):
    """A feature element as float32: node rows are float32, or bfloat16 bit patterns (uint16) on large
    graphs (``seeder.features.bfloat16``). Compiled code only (``_widen_overload``)."""
    raise NotImplementedError("_widen runs inside compiled kernels only")


@overload(_widen, inline="always")
def _widen_overload(value):
    if value == types.uint16:
        return lambda value: _bfloat16_bits_to_float32(value)
    return lambda value: np.float32(value)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _dot(row: np.ndarray, query: np.ndarray) -> np.float32:
    """sim(q, u) for L2-normalised features. ``reassoc`` lets the sum run in SIMD lanes (a strict
    left-to-right float32 sum cannot); the order is fixed by the compiled code, so a pair's cosine
    does not depend on the batch it is computed in."""
    acc = np.float32(0.0)
    for i in range(query.shape[0]):
        acc += _widen(row[i]) * query[i]
    return acc


@njit(cache=True, nogil=True)
def descending_keys(scores: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """int64 keys whose ascending order is (``scores`` descending, ``nodes`` ascending): the order in
    which a hop selects its candidates, so one integer sort (or partition) replaces a two-key
    comparison. -0.0 ranks as 0.0. The node is the low 32 bits (``nodes`` must be below 2^32)."""
    negated = np.empty(scores.shape[0], np.float32)
    for i in range(scores.shape[0]):
        negated[i] = -scores[i] + np.float32(0.0)  # -0.0 -> 0.0
    bits = negated.view(np.int32)
    keys = np.empty(scores.shape[0], np.int64)
    for i in range(scores.shape[0]):
        b = np.int64(bits[i])
        if b < 0:  # negative floats order backwards as signed ints
            b ^= 0x7FFFFFFF
        keys[i] = (b << _NODE_BITS) | nodes[i]
    return keys


@njit(cache=True, nogil=True)
def _sift_down(heap: np.ndarray, start: int, size: int) -> None:
    """Restore the max-heap order of ``heap[:size]`` below ``start`` after its entry changed."""
    i = start
    x = heap[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] > heap[child]:
            child += 1
        if heap[child] <= x:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = x


@njit(cache=True, nogil=True)
def smallest_sorted(keys: np.ndarray, k: int, out: np.ndarray) -> int:
    """The ``min(k, len(keys))`` smallest ``keys``, ascending, into ``out``; returns how many.

    A hop keeps ~100 of a few thousand candidates: a bounded max-heap rejects most keys with one
    comparison, and a heap sort orders the kept ones. (numba's np.partition took 7 s to compile, as
    long as the rest of the module.)"""
    size = 0
    for x in keys:
        if size < k:
            i = size
            size += 1
            while i > 0 and out[(i - 1) // 2] < x:
                out[i] = out[(i - 1) // 2]
                i = (i - 1) // 2
            out[i] = x
        elif x < out[0]:
            out[0] = x
            _sift_down(out, 0, size)
    for end in range(size - 1, 0, -1):
        top = out[0]
        out[0] = out[end]
        out[end] = top
        _sift_down(out, 0, end)
    return size


@njit(cache=True, nogil=True)
def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` copied into a larger array of ``size`` entries: scratch sized for a typical query grows
    for the rare large one instead of being sized for the worst case up front."""
    b = np.empty(size, a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def expand_hops(
    indptr: np.ndarray,
    neighbors: np.ndarray,
    relations: np.ndarray,
    node_features: np.ndarray,
    query_features: np.ndarray,
    seeds: np.ndarray,
    keep_per_hop: np.ndarray,
    budget: int,
    neighbor_cap: int,
    candidate_cap: int,
    weights: np.ndarray,
    parent_is_score: bool,
    learned: bool,
    relation_features: np.ndarray,
    path_terms: np.ndarray,
    trie_children: np.ndarray,
    end_terms: np.ndarray,
    off_path_term: np.float32,
):
    """Seeds and hops 1..K of K-HOP-WITH-FILTERING (paper, Section 3) for every query of a batch.

    Inputs as in ``seeder.retrieve.khop.expand_batch``: CSR ``indptr``/``neighbors``/``relations``
    (both directions; a node's first ``neighbor_cap`` entries are its sample), features [N, d] (read in
    place; float32, or bfloat16 bits as uint16), float32 query features [Qb, d], int64 seeds
    [Qb, k0] (-1 padding), ``weights`` float32 (w1, w2, w3). With ``learned`` False the w3 term is
    sim(q, r) of ``relation_features`` [2R, d]; with it True, it is ``path_terms`` [Qb, T] at
    ``trie_children`` [T, 2R] of the source's trie node (``off_path_term`` off the trie), and
    ``end_terms`` [Qb, T] gives each node's path_end.

    Returns (count [Qb], nodes, hop int8, score float32, path_end float32): flat, by (query,
    selection order). One query at a time: its candidate slots and table are reused by the next.
    """
    num_q = query_features.shape[0]
    num_seeds = seeds.shape[1]
    hops = keep_per_hop.shape[0]
    w1, w2, w3 = weights[0], weights[1], weights[2]
    per_query = min(budget, num_seeds + int(keep_per_hop.sum()))
    counts = np.zeros(num_q, np.int64)
    out_node = np.empty(num_q * per_query, np.int64)
    out_hop = np.empty(num_q * per_query, np.int8)
    out_score = np.empty(num_q * per_query, np.float32)
    out_end = np.zeros(num_q * per_query, np.float32)
    out_parent = np.empty(num_q * per_query, np.float32)  # what the w2 term of its out-edges reads
    out_trie = np.zeros(num_q * per_query, np.int64)  # learned: trie node of the node's best path

    # Candidate slots of the current query (selected nodes included, so the table answers "already
    # selected?" too). Grown when a hop could add more than they hold.
    capacity = _INITIAL_CAPACITY
    while capacity < num_seeds:
        capacity *= 2
    slot_node = np.empty(capacity, np.int64)
    slot_edge = np.empty(capacity, np.float32)  # best w2 * parent + w3 * relation term so far
    slot_cos = np.empty(capacity, np.float32)  # sim(q, u), NaN until computed
    slot_trie = np.empty(capacity, np.int64)  # learned: trie node of the best edge's path
    slot_hop = np.empty(capacity, np.int64)  # last hop whose edges reached it; -1 once selected
    table = np.empty(_table_size(capacity, _HOP_SPREAD), np.int64)
    ranked = np.empty(capacity, np.int64)  # this hop's candidate slots
    rank_score = np.empty(capacity, np.float32)
    rank_node = np.empty(capacity, np.int64)
    pending = np.empty(capacity, np.int64)  # this hop's slots still without a cosine
    best = np.empty(max(per_query, 1), np.int64)  # the selected keys of a hop, best first
    edge_node = np.empty(capacity, np.int64)  # this hop's sampled edges: target,
    edge_term = np.empty(capacity, np.float32)  # w2 * parent + w3 * relation term,
    edge_child = np.empty(capacity, np.int64)  # learned: trie node of the path through it

    # sim(q, r) by the same dot product as the nodes': a matrix product over the batch would round
    # differently with the batch's size, and ties would then depend on expand.batch_queries.
    rel_sims = np.zeros(0 if learned else relation_features.shape[0], np.float32)
    written = 0
    for q in range(num_q):
        query = query_features[q]
        for r in range(rel_sims.shape[0]):
            rel_sims[r] = _dot(relation_features[r], query)
        base = written
        count = 0
        mask = _reset_table(table, slot_node, 0, num_seeds, _HOP_SPREAD)
        for c in range(num_seeds):
            s = seeds[q, c]
            if s < 0:
                continue
            if written - base >= budget:
                break
            pos = _probe(table, mask, slot_node, s)
            if table[pos] >= 0:  # a repeated seed: the first occurrence stands
                continue
            table[pos] = count
            slot_node[count] = s
            slot_hop[count] = -1
            count += 1
            cos = _dot(node_features[s], query)
            out_node[written] = s
            out_hop[written] = 0
            out_score[written] = cos
            out_parent[written] = cos
            out_trie[written] = 0  # the trie's root
            written += 1
        src_lo, src_hi = base, written
        for h in range(1, hops + 1):
            room = budget - (written - base)
            if room <= 0:
                break
            # Room for every edge this hop may score, decided before reading any of them.
            incoming = 0
            used = 0
            for i in range(src_lo, src_hi):
                v = out_node[i]
                sample = min(indptr[v + 1] - indptr[v], neighbor_cap)
                incoming += max(min(sample, candidate_cap - used), 0)
                used += sample
            grown = count + incoming > capacity
            if grown:
                while capacity < count + incoming:
                    capacity *= 2
                slot_node = _grown(slot_node, capacity)
                slot_edge = _grown(slot_edge, capacity)
                slot_cos = _grown(slot_cos, capacity)
                slot_trie = _grown(slot_trie, capacity)
                slot_hop = _grown(slot_hop, capacity)
                table = np.empty(_table_size(capacity, _HOP_SPREAD), np.int64)
                ranked = np.empty(capacity, np.int64)
                rank_score = np.empty(capacity, np.float32)
                rank_node = np.empty(capacity, np.int64)
                pending = np.empty(capacity, np.int64)
                edge_node = np.empty(capacity, np.int64)
                edge_term = np.empty(capacity, np.float32)
                edge_child = np.empty(capacity, np.int64)
            if grown or _HOP_SPREAD * (count + incoming) > mask + 1:
                mask = _reset_table(table, slot_node, count, count + incoming, _HOP_SPREAD)

            # The new sources' capped edges and their w2 * parent + w3 * relation terms, gathered
            # first: this loop has no data-dependent branch, so the reads of many sources' slices
            # overlap instead of waiting behind mispredicted table probes.
            num_edges = 0
            used = 0
            for i in range(src_lo, src_hi):
                if i + _SLICES_AHEAD < src_hi:  # its offsets were read above, so they are cached
                    ahead = indptr[out_node[i + _SLICES_AHEAD]]
                    _prefetch(neighbors, ahead)
                    _prefetch(relations, ahead)
                v = out_node[i]
                start = indptr[v]
                degree = indptr[v + 1] - start
                sample = min(degree, neighbor_cap)
                take = max(min(sample, candidate_cap - used), 0)
                used += sample
                parent = w2 * out_parent[i]
                parent_trie = out_trie[i]
                for j in range(take):  # a hub's sample is its slice's first entries (edge-hash order)
                    r = relations[start + j]
                    edge_node[num_edges] = neighbors[start + j]
                    if learned:
                        child = trie_children[parent_trie, r] if parent_trie >= 0 else -1
                        term = path_terms[q, child] if child >= 0 else off_path_term
                        edge_term[num_edges] = parent + w3 * term
                        edge_child[num_edges] = child
                    else:
                        edge_term[num_edges] = parent + w3 * rel_sims[r]
                        edge_child[num_edges] = -1
                    num_edges += 1

            # Max over each candidate's new edges (merged with its carried best).
            for e in range(num_edges):
                u = edge_node[e]
                edge = edge_term[e]
                child = edge_child[e]
                pos = _probe(table, mask, slot_node, u)
                s = table[pos]
                if s < 0:
                    table[pos] = count
                    slot_node[count] = u
                    slot_edge[count] = edge
                    slot_cos[count] = np.nan
                    slot_trie[count] = child
                    slot_hop[count] = h
                    count += 1
                elif slot_hop[s] < 0:  # selected already
                    continue
                elif learned and slot_hop[s] != h:
                    # Nothing is carried with the learned prior (see khop.py): a candidate passed
                    # over at an earlier hop starts again from this hop's edges.
                    slot_edge[s] = edge
                    slot_trie[s] = child
                    slot_hop[s] = h
                elif edge > slot_edge[s]:
                    slot_edge[s] = edge
                    slot_trie[s] = child
                elif edge == slot_edge[s] and child < slot_trie[s]:
                    slot_trie[s] = child  # among tied paths, the smallest trie node

            # This hop's candidates: with cosine terms every unselected one seen so far (the carry:
            # their best edge over all earlier sources is kept), with learned terms this hop's only.
            num_ranked = 0
            num_pending = 0
            for s in range(count):
                if slot_hop[s] < 0 or (learned and slot_hop[s] != h):
                    continue
                if np.isnan(slot_cos[s]):
                    pending[num_pending] = s
                    num_pending += 1
                ranked[num_ranked] = s
                num_ranked += 1
            for i in range(min(num_pending, _ROWS_AHEAD)):
                _prefetch_row(node_features[slot_node[pending[i]]])
            for i in range(num_pending):
                if i + _ROWS_AHEAD < num_pending:
                    _prefetch_row(node_features[slot_node[pending[i + _ROWS_AHEAD]]])
                s = pending[i]
                slot_cos[s] = _dot(node_features[slot_node[s]], query)
            for i in range(num_ranked):
                s = ranked[i]
                rank_score[i] = w1 * slot_cos[s] + slot_edge[s]
                rank_node[i] = slot_node[s]
            keys = descending_keys(rank_score[:num_ranked], rank_node[:num_ranked])

            # The best b_h by (score desc, id asc), within the remaining budget.
            limit = min(keep_per_hop[h - 1], room, num_ranked)
            if limit <= 0:
                src_lo = src_hi = written
                continue
            smallest_sorted(keys, limit, best)
            src_lo = written  # the next hop reads the edges of this hop's nodes only
            for i in range(limit):
                u = best[i] & _NODE_MASK
                s = table[_probe(table, mask, slot_node, u)]
                slot_hop[s] = -1
                score = w1 * slot_cos[s] + slot_edge[s]
                out_node[written] = u
                out_hop[written] = h
                out_score[written] = score
                out_parent[written] = score if parent_is_score else slot_cos[s]
                out_trie[written] = slot_trie[s]
                written += 1
            src_hi = written
        if learned:
            for i in range(base, written):
                t = out_trie[i]
                out_end[i] = end_terms[q, t] if t >= 0 else off_path_term
        counts[q] = written - base
    return counts, out_node[:written], out_hop[:written], out_score[:written], out_end[:written]


@njit(cache=True, nogil=True)
def induced_edges_kernel(
    indptr: np.ndarray,
    neighbors: np.ndarray,
    relations: np.ndarray,
    num_relations: int,
    num_nodes: int,
    heavy_mask: np.ndarray,
    heavy_nodes: np.ndarray,
    heavy_keys: np.ndarray,
    heavy_rel: np.ndarray,
    nodes: np.ndarray,
    node_ptr: np.ndarray,
):
    """Every directed KG edge among each query's selected nodes (paper, Section 3: the subgraph
    keeps the edges it induces), once, sorted by (source, destination, relation).

    A query's nodes go into a table of a few hundred entries, so a neighbour's membership test stays
    in cache. Light nodes (not ``heavy_mask``) scan their CSR slice: out-edges to selected nodes, and
    in-edges from selected heavy nodes. Between two heavy nodes the edges come from ``heavy_keys``
    (heavy rank * N + out-neighbour, sorted, relation in ``heavy_rel``), so a hub costs a binary
    search per selected heavy pair instead of a scan of its slice.

    Returns (edge count [Qb], source, destination, base relation): flat, by query, as local indices
    into ``nodes[node_ptr[q]:node_ptr[q + 1]]``.
    """
    num_q = node_ptr.shape[0] - 1
    edge_counts = np.zeros(num_q, np.int64)
    capacity = 1024
    while capacity < 4 * nodes.shape[0]:
        capacity *= 2
    out_src = np.empty(capacity, np.int32)
    out_dst = np.empty(capacity, np.int32)
    out_rel = np.empty(capacity, np.int32)
    largest = 1
    for q in range(num_q):
        largest = max(largest, node_ptr[q + 1] - node_ptr[q])
    table = np.empty(_table_size(largest, _INDUCED_SPREAD), np.int64)
    heavy = np.empty(largest, np.bool_)
    heavy_local = np.empty(largest, np.int64)
    keys = np.empty(1024, np.int64)
    ordered = np.empty(1024, np.int64)
    written = 0
    for q in range(num_q):
        local_nodes = nodes[node_ptr[q] : node_ptr[q + 1]]
        m = local_nodes.shape[0]
        mask = _reset_table(table, local_nodes, m, m, _INDUCED_SPREAD)
        num_heavy = 0
        for i in range(m):
            heavy[i] = heavy_mask[local_nodes[i]]
            if heavy[i]:
                heavy_local[num_heavy] = i
                num_heavy += 1
        # Edges as (src * m + dst) * R + relation: one integer sort orders and de-duplicates them.
        found = 0
        for i in range(min(m, 2 * _SLICES_AHEAD)):
            _prefetch(indptr, local_nodes[i])
        for i in range(m):
            if i + 2 * _SLICES_AHEAD < m:
                _prefetch(indptr, local_nodes[i + 2 * _SLICES_AHEAD])
            if i + _SLICES_AHEAD < m and not heavy[i + _SLICES_AHEAD]:
                ahead = indptr[local_nodes[i + _SLICES_AHEAD]]
                _prefetch(neighbors, ahead)
                _prefetch(relations, ahead)
            if heavy[i]:
                continue
            v = local_nodes[i]
            for p in range(indptr[v], indptr[v + 1]):
                j = table[_probe(table, mask, local_nodes, np.int64(neighbors[p]))]
                if j < 0:
                    continue
                r = np.int64(relations[p])
                if r < num_relations:
                    key = (i * m + j) * num_relations + r
                elif heavy[j]:
                    key = (j * m + i) * num_relations + r - num_relations
                else:
                    continue  # light -> light: found from the other end, as an out-edge
                if found == keys.shape[0]:
                    keys = _grown(keys, 2 * found)
                keys[found] = key
                found += 1
        for a in range(num_heavy):
            i = heavy_local[a]
            rank = np.searchsorted(heavy_nodes, local_nodes[i])
            for b in range(num_heavy):
                j = heavy_local[b]
                lookup = rank * num_nodes + local_nodes[j]
                k = np.searchsorted(heavy_keys, lookup)
                while k < heavy_keys.shape[0] and heavy_keys[k] == lookup:
                    if found == keys.shape[0]:
                        keys = _grown(keys, 2 * found)
                    keys[found] = (i * m + j) * num_relations + heavy_rel[k]
                    found += 1
                    k += 1
        if ordered.shape[0] < found:
            ordered = np.empty(keys.shape[0], np.int64)
        smallest_sorted(keys[:found], found, ordered)
        start = written
        for e in range(found):
            key = ordered[e]
            if e > 0 and key == ordered[e - 1]:
                continue  # a repeated KG edge
            if written == out_src.shape[0]:
                out_src = _grown(out_src, 2 * written)
                out_dst = _grown(out_dst, 2 * written)
                out_rel = _grown(out_rel, 2 * written)
            pair = key // num_relations
            out_src[written] = pair // m
            out_dst[written] = pair % m
            out_rel[written] = key % num_relations
            written += 1
        edge_counts[q] = written - start
    return edge_counts, out_src[:written], out_dst[:written], out_rel[:written]
