"""Which edges a new dataset version added and removed, and which of the parent's subgraphs they can change.

An update (``seeder.preprocessing.incremental``) extracts again only the subgraphs a change reaches.
For changed edges that takes two steps, both compiled passes over CSR arrays:

- ``changed_edges``: the two versions' CSRs compared slice by slice. ``build_csr`` orders each slice by
  edge hash, so equal heads and tails are skipped and the rest merged by hash: no pass over the edges
  tables and no sort of a hub's slice.
- ``regions_changed_by_edges``: each parent subgraph tested against the changed edges its extraction
  read, with the cosine relation score (K-HOP-WITH-FILTERING, ``seeder.retrieve.khop``). What a node
  reads is its sample, the first ``neighbor_cap`` entries of its slice, so the same merge finds the
  entries that entered or left the samples of the changed edges' endpoints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from seeder.config import SeederConfig
from seeder.data.store import KnowledgeGraph, mix_entry
from seeder.data.subgraphs import SubgraphSet, isin_sorted
from seeder.data.update import edge_keys
from seeder.features import bfloat16

_entry_hash = njit(cache=True, nogil=True, inline="always")(mix_entry)
"""``edge_hashes`` of one CSR entry (uint64 arguments), compiled from the same function."""

WHOLE_SLICE = 2**62
"""A ``cap`` of ``_unmatched_entries`` that compares whole slices."""


@njit(cache=True, nogil=True, inline="always")
def _renumbered(relation: int, shift_from: int, shift: int) -> int:
    """A parent's relation id as the new version numbers it: inverses (>= ``shift_from``) plus ``shift``."""
    return relation + (shift if relation >= shift_from else 0)


@njit(cache=True, nogil=True)
def _unmatched_entries(ip_old, nb_old, rel_old, ip_new, nb_new, rel_new, shift_from, shift, merge, nodes, cap):
    """(gone, came): bool per entry of the old and the new CSR, over the first ``cap`` entries of the
    slices of ``nodes``: True where the entry may be one the other version lacks. Every such entry is
    marked, and marked entries that both versions hold are matched as sets afterwards. A parent relation
    id >= ``shift_from`` (an inverse) is read plus ``shift``, as the new version numbers it.

    Both windows are in edge-hash order (``build_csr``; a window is a slice's first entries): equal
    entries before the first difference and after the last one (aligned from each end) are skipped, and
    in between the two windows are merged by hash. When the relation ids moved (``merge`` False) the
    hashes of the parent's entries changed too, and the whole span between the first and the last
    difference is marked."""
    n_old = ip_old.shape[0] - 1
    gone = np.zeros(nb_old.shape[0], np.bool_)
    came = np.zeros(nb_new.shape[0], np.bool_)
    for a in nodes:
        i, ie = 0, 0
        if a < n_old:
            i, ie = ip_old[a], min(ip_old[a + 1], ip_old[a] + cap)
        j, je = ip_new[a], min(ip_new[a + 1], ip_new[a] + cap)
        while i < ie and j < je:  # the common head
            if nb_old[i] != nb_new[j] or _renumbered(rel_old[i], shift_from, shift) != rel_new[j]:
                break
            i += 1
            j += 1
        while i < ie and j < je:  # the common tail
            if nb_old[ie - 1] != nb_new[je - 1] or _renumbered(rel_old[ie - 1], shift_from, shift) != rel_new[je - 1]:
                break
            ie -= 1
            je -= 1
        while merge and i < ie and j < je:
            r = _renumbered(rel_old[i], shift_from, shift)
            head = np.uint64(a)
            h_old = _entry_hash(head, np.uint64(nb_old[i]), np.uint64(r))
            h_new = _entry_hash(head, np.uint64(nb_new[j]), np.uint64(rel_new[j]))
            if h_old < h_new:
                gone[i] = True
                i += 1
            elif h_new < h_old:
                came[j] = True
                j += 1
            else:  # the same hash: the same entry, or a collision whose order the set match settles
                if nb_old[i] != nb_new[j] or r != rel_new[j]:
                    gone[i] = True
                    came[j] = True
                i += 1
                j += 1
        gone[i:ie] = True
        came[j:je] = True
    return gone, came


def _entries(kg: KnowledgeGraph, marked: np.ndarray, shift_from: int = 0, shift: int = 0) -> np.ndarray:
    """[E, 3] (head, neighbour, relation as the new version numbers it) of the ``marked`` CSR entries."""
    pos = np.flatnonzero(marked)
    rel = np.asarray(kg.edge_relations)[pos].astype(np.int64)
    rel += np.where(rel >= shift_from, shift, 0)
    head = np.searchsorted(np.asarray(kg.indptr), pos, "right") - 1
    return np.stack([head.astype(np.int64), np.asarray(kg.neighbors)[pos].astype(np.int64), rel], axis=1)


def _entry_differences(parent: KnowledgeGraph, kg: KnowledgeGraph, nodes: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(gone, came): the entries, as ``_entries`` rows, in the first ``cap`` entries of the slices of
    ``nodes`` of one version and not of the other's (set difference per slice)."""
    r, r_old = kg.num_relations, parent.num_relations
    gone, came = _unmatched_entries(
        np.asarray(parent.indptr),
        np.asarray(parent.neighbors),
        np.asarray(parent.edge_relations),
        np.asarray(kg.indptr),
        np.asarray(kg.neighbors),
        np.asarray(kg.edge_relations),
        r_old,
        r - r_old,
        r == r_old,
        nodes,
        cap,
    )
    old, new = _entries(parent, gone, r_old, r - r_old), _entries(kg, came)
    n, width = kg.num_nodes, 2 * max(r, 1)
    old_keys, new_keys = (edge_keys(e[:, 0], e[:, 2], e[:, 1], n, width) for e in (old, new))
    return old[~isin_sorted(old_keys, new_keys)], new[~isin_sorted(new_keys, old_keys)]


def changed_edges(parent: KnowledgeGraph, kg: KnowledgeGraph) -> tuple[np.ndarray, np.ndarray]:
    """(added, removed) edges from ``parent`` to ``kg``, each [E, 3] (src, relation, dst): the out-entries
    (relation < the count of relations) among the two CSRs' differences."""
    gone, came = _entry_differences(parent, kg, np.arange(kg.num_nodes), WHOLE_SLICE)
    out_edge = [e[e[:, 2] < kg.num_relations][:, [0, 2, 1]] for e in (came, gone)]
    return out_edge[0], out_edge[1]


EDGE_SCORE_MARGIN = 1e-4
"""A candidate that a new edge scores within this of a hop's last kept score counts as able to enter
it: the compiled hops sum each cosine in their own order, this test in numpy's (float32 either way)."""


@njit(cache=True, nogil=True)
def _rows_reading_changes(node_ptr, nodes, hop, hops, touched, moved, ip_old, ip_new, cap, candidate_cap, anchor, other, kind):
    """The regions test's pass over the parent's subgraph rows. Half-edges are sorted by ``anchor``
    (``other`` the node at the far end, ``kind`` 0 an added or removed edge, 1 an entry that left a
    sample, 2 one that entered it); ``touched`` marks every anchor, ``moved`` the nodes whose sample
    changed. Returns ``changed`` per row, and for the rows it leaves open the pairs (entry position,
    half-edge) to score: an entered entry of an expanded node whose far end lies outside the row. Each
    row's nodes are stamped once, so membership costs one pass, with no sort."""
    rows = node_ptr.shape[0] - 1
    n_old = ip_old.shape[0] - 1
    changed = np.zeros(rows, np.bool_)
    stamp = np.full(ip_new.shape[0] - 1, -1, np.int32)  # int32: half the cache lines of its random reads
    pair_entry = np.empty(1024, np.int64)
    pair_half = np.empty(1024, np.int64)
    pairs = 0
    reads_moved = np.zeros(hops, np.bool_)
    for row in range(rows):
        lo, hi = node_ptr[row], node_ptr[row + 1]
        reads_moved[:] = False
        any_touched = False
        for p in range(lo, hi):
            a = nodes[p]
            any_touched |= touched[a]
            if hop[p] < hops:
                reads_moved[hop[p]] |= moved[a]
        if not any_touched:
            continue
        # khop.py's candidate_cap: a hop takes its sources' samples in order until the cap. A hop whose
        # sources' samples are all unchanged reads the same candidates, cut or not; one that reads a
        # changed sample and is cut (in either version) may cut elsewhere.
        for h in range(hops):
            if not reads_moved[h]:
                continue
            used_old, used_new = 0, 0
            for p in range(lo, hi):
                if hop[p] == h:
                    a = nodes[p]
                    used_old += min(ip_old[a + 1] - ip_old[a], cap) if a < n_old else 0
                    used_new += min(ip_new[a + 1] - ip_new[a], cap)
            if max(used_old, used_new) > candidate_cap:
                changed[row] = True
        if changed[row]:
            continue
        for p in range(lo, hi):
            stamp[nodes[p]] = row
        first_pair = pairs
        for p in range(lo, hi):
            a = nodes[p]
            if not touched[a]:
                continue
            expanded = hop[p] < hops
            for k in range(np.searchsorted(anchor, a), np.searchsorted(anchor, a, side="right")):
                if kind[k] != 0 and not expanded:
                    continue  # a sample only matters to a node the extraction expanded
                if stamp[other[k]] == row:
                    changed[row] = True
                    break
                if kind[k] == 2:
                    if pairs == pair_entry.shape[0]:
                        pair_entry = np.concatenate((pair_entry, np.empty_like(pair_entry)))
                        pair_half = np.concatenate((pair_half, np.empty_like(pair_half)))
                    pair_entry[pairs] = p
                    pair_half[pairs] = k
                    pairs += 1
            if changed[row]:
                pairs = first_pair
                break
    return changed, pair_entry[:pairs], pair_half[:pairs]


@njit(cache=True, nogil=True)
def _entry_thresholds(node_ptr, hop, score, entries, rows, hops, budget, keep_per_hop):
    """Per pair (``entries[i]`` of row ``rows[i]``, grouped by row): the lowest score a new candidate of
    the entry's node must reach to enter a later hop, the minimum over hops h > hop[entry] of their last
    kept score; -inf where such a hop kept fewer nodes than it had room for (it took every candidate, so
    a new one enters), +inf where no later hop had room."""
    out = np.empty(entries.shape[0], np.float32)
    kept = np.zeros(hops + 1, np.int64)
    lowest = np.empty(hops + 1, np.float32)
    after = np.empty(hops + 2, np.float32)
    threshold = np.empty(hops + 1, np.float32)
    i = 0
    while i < entries.shape[0]:
        row = rows[i]
        kept[:] = 0
        lowest[:] = np.inf
        for p in range(node_ptr[row], node_ptr[row + 1]):
            kept[hop[p]] += 1
            lowest[hop[p]] = min(lowest[hop[p]], np.float32(score[p]))
        after[hops + 1] = np.inf
        room = budget - kept[0]  # what was left when hop h began
        for h in range(1, hops + 1):
            wanted = min(keep_per_hop[h - 1], max(room, 0))
            threshold[h] = -np.inf if kept[h] < wanted else (lowest[h] if kept[h] > 0 else np.inf)
            room -= kept[h]
        for h in range(hops, 0, -1):
            after[h] = min(threshold[h], after[h + 1])
        while i < entries.shape[0] and rows[i] == row:
            out[i] = after[hop[entries[i]] + 1]
            i += 1
    return out


def regions_changed_by_edges(
    kg: KnowledgeGraph,
    parent_kg: KnowledgeGraph,
    added_edges: np.ndarray,
    removed_edges: np.ndarray,
    touched: np.ndarray,
    config: SeederConfig,
    subgraphs: SubgraphSet,
    features_dir: Path,
) -> np.ndarray:
    """bool per row of the parent's ``subgraphs``: whether the added and removed edges (``touched``:
    their endpoints) can change its extraction, with the cosine relation score. Exact on the safe side:
    every row it passes extracts the same subgraph on the new version. What a node a reads is its sample,
    so each entry a - r -> b that entered or left the sample of a node a expanded at hop h < K is tested,
    and each added or removed edge for the induced edges:

    - b in the row: its score or the induced edges change;
    - b outside it, entry left: b lost every hop already, and a lower score changes nothing;
    - b outside it, entry entered: b now scores at least w1 sim(q,b) + w2 parent(a) + w3 sim(q,r) at
      every later hop (the best edge term is carried), so it enters only if that reaches the lowest
      kept score of a hop after h (``_entry_thresholds``);
    - a hop's ``candidate_cap`` cut moves with its sources' samples: a row whose hop is cut and reads
      a changed sample is extracted again.
    """
    cfg = config.expand
    left, entered = _entry_differences(parent_kg, kg, np.flatnonzero(touched), cfg.neighbor_cap)
    ends = np.concatenate([added_edges, removed_edges])
    # Half-edges: 0 an added or removed edge (induced edges: any node of the row reads it), 1 an entry
    # that left a sample, 2 one that entered it (only an expanded node reads a sample).
    anchor = np.concatenate([ends[:, 0], ends[:, 2], left[:, 0], entered[:, 0]])
    other = np.concatenate([ends[:, 2], ends[:, 0], left[:, 1], entered[:, 1]])
    relation = np.concatenate([np.full(2 * len(ends) + len(left), -1), entered[:, 2]])
    kind = np.repeat(np.array([0, 1, 2], np.int8), [2 * len(ends), len(left), len(entered)])
    order = np.argsort(anchor, kind="stable")
    anchor, other, relation, kind = anchor[order], other[order], relation[order], kind[order]
    moved = np.zeros(len(touched), np.bool_)
    moved[left[:, 0]] = True
    moved[entered[:, 0]] = True
    changed, entry, half = _rows_reading_changes(
        subgraphs.node_ptr,
        subgraphs.nodes,
        subgraphs.hop,
        cfg.hops,
        touched,
        moved,
        np.asarray(parent_kg.indptr),
        np.asarray(kg.indptr),
        cfg.neighbor_cap,
        cfg.candidate_cap,
        anchor,
        other,
        kind,
    )
    if not entry.size:
        return changed
    row = np.searchsorted(subgraphs.node_ptr, entry, "right") - 1
    thresholds = _entry_thresholds(
        subgraphs.node_ptr,
        subgraphs.hop,
        subgraphs.score,
        entry,
        row,
        cfg.hops,
        cfg.budget,
        np.asarray(cfg.keep_per_hop, np.int64),
    )
    node_rows = bfloat16.filter_features(features_dir)
    query_rows = np.load(Path(features_dir) / "query.npy", mmap_mode="r")
    relation_rows = np.load(Path(features_dir) / "relation.npy")
    feature_row = np.searchsorted(np.load(Path(features_dir) / "query_ids.npy"), subgraphs.query_ids)
    w1, w2, w3 = cfg.weights
    for lo in range(0, entry.size, 65_536):
        e, r, k = entry[lo : lo + 65_536], row[lo : lo + 65_536], half[lo : lo + 65_536]
        q = np.asarray(query_rows[feature_row[r]], dtype=np.float32)
        # Each node's row read once, in file order: on a cold page cache, scattered reads cost the most.
        reads = [other[k]] + ([] if cfg.parent_term == "score" else [subgraphs.nodes[e]])
        ids = np.unique(np.concatenate(reads))
        vectors = np.asarray(node_rows[ids])
        vectors = bfloat16.from_bfloat16_bits(vectors) if vectors.dtype == np.uint16 else vectors.astype(np.float32)

        def cosine(nodes: np.ndarray) -> np.ndarray:
            return np.einsum("ij,ij->i", vectors[np.searchsorted(ids, nodes)], q)

        parent = subgraphs.score[e] if cfg.parent_term == "score" else cosine(subgraphs.nodes[e])
        score = w1 * cosine(other[k]) + w2 * parent + w3 * np.einsum("ij,ij->i", relation_rows[relation[k]], q)
        enters = score >= thresholds[lo : lo + 65_536] - EDGE_SCORE_MARGIN
        changed[r[enters]] = True
    return changed
