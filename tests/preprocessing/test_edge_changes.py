"""The update's edge comparison (``seeder.preprocessing.edge_changes``) against plain set arithmetic on a
tiny graph: the edges two versions differ by, and the entries that entered or left each node's sample
(its slice's first ``neighbor_cap`` entries), as multisets. Whether the subgraphs it keeps equal a full run's is
tested with the whole update in ``test_incremental.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from seeder.data.store import edge_hashes, open_dataset
from seeder.preprocessing import edge_changes as ec
from tests.datasets import write_tiny_dataset
from tests.preprocessing.test_incremental import edges_only_change, random_edges_change, write_change


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    return Path(write_tiny_dataset(tmp_path_factory.mktemp("edges") / "v1", 60, seed=11, two_hop_answers=True, id_stride=3))


def triples(kg) -> set[tuple[int, int, int]]:
    return set(zip(*(kg.table("edges").column(c).to_pylist() for c in ("src", "relation", "dst"))))


def sample_entries(kg, cap: int) -> Counter:
    """(node, neighbour, relation, inverse) of the first ``cap`` entries of every slice, read entry by
    entry; a multiset, since a graph may hold the same triple twice."""
    indptr, neighbors, relations = (np.asarray(a) for a in (kg.indptr, kg.neighbors, kg.edge_relations))
    r = kg.num_relations
    return Counter(
        (a, int(neighbors[p]), int(relations[p]) % r, bool(relations[p] >= r))
        for a in range(kg.num_nodes)
        for p in range(indptr[a], min(indptr[a + 1], indptr[a] + cap))
    )


def test_changed_edges_are_the_edges_tables_difference(parent, tmp_path):
    """Also when a new relation shifts every inverse relation id (the path without the hash merge)."""
    for new in (write_change(tmp_path, parent), edges_only_change(tmp_path, parent, new_relation=True)):
        old_kg, new_kg = open_dataset(parent), open_dataset(new)
        added, removed = ec.changed_edges(old_kg, new_kg)
        assert {tuple(e) for e in added.tolist()} == triples(new_kg) - triples(old_kg)
        assert {tuple(e) for e in removed.tolist()} == triples(old_kg) - triples(new_kg)
        assert len(added) and len(removed)


@pytest.mark.parametrize("cap", [3, ec.WHOLE_SLICE])
def test_entry_differences_are_the_samples_differences(parent, tmp_path, cap):
    """With a cap below most degrees (about 10 here) a changed edge moves a sample only when it lies
    inside it; what entered and left is the samples' set difference, for every node asked about."""
    for new in (random_edges_change(tmp_path, parent, seed=3, count=40), edges_only_change(tmp_path, parent, new_relation=True)):
        old_kg, new_kg = open_dataset(parent), open_dataset(new)
        left, entered = ec._entry_differences(old_kg, new_kg, np.arange(new_kg.num_nodes), cap)
        r = new_kg.num_relations
        found = [Counter((a, b, rel % r, bool(rel >= r)) for a, b, rel in e.tolist()) for e in (left, entered)]
        before, after = sample_entries(old_kg, cap), sample_entries(new_kg, cap)
        assert found[0] == before - after and found[1] == after - before
        assert found[0] and found[1]
        some = np.arange(0, new_kg.num_nodes, 7)
        left_some, entered_some = ec._entry_differences(old_kg, new_kg, some, cap)
        assert set(left_some[:, 0].tolist()) | set(entered_some[:, 0].tolist()) <= set(some.tolist())
        assert len(left_some) < len(left)


def test_the_compiled_entry_hash_is_the_csrs_edge_hash():
    """The update merges two versions' slices by the hash ``build_csr`` ordered them by: a different
    hash would still give the right edges, only by marking whole slices."""
    rng = np.random.default_rng(5)
    heads, tails, rels = rng.integers(0, 2**31, 500), rng.integers(0, 2**31, 500), rng.integers(0, 200, 500)
    compiled = [int(ec._entry_hash(np.uint64(h), np.uint64(t), np.uint64(r))) for h, t, r in zip(heads, tails, rels)]
    assert compiled == edge_hashes(heads, tails, rels).astype(np.int64).tolist()
