"""Golden relation paths against a brute-force enumeration of every relation path."""

from __future__ import annotations

import numpy as np
import pytest

from seeder.config import ConfigError, PriorConfig
from seeder.data.store import build_csr
from seeder.retrieve.paths import (
    ROOT,
    check_code_range,
    decode,
    describe,
    encode,
    golden_paths,
    golden_paths_batched,
    path_digits,
    path_length,
)


def _random_graph(rng, n=40, e=120, r=3):
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    rel = rng.integers(0, r, e)
    return build_csr(n, r, src, dst, rel), n, r


def _brute_force(indptr, neighbors, relations, num_ids, seeds, answers, max_length):
    """Every relation path from the seeds, followed without caps: {(query, code): (hits, reached)}."""
    out = {}
    for q, (row, ans) in enumerate(zip(seeds, answers)):
        frontier = {ROOT: {int(s) for s in row if s >= 0}}
        for _ in range(max_length):
            nxt = {}
            for code, nodes in frontier.items():
                for v in nodes:
                    for p in range(indptr[v], indptr[v + 1]):
                        nxt.setdefault(code * num_ids + int(relations[p]), set()).add(int(neighbors[p]))
            for code, nodes in nxt.items():
                hits = len(nodes & set(ans))
                if hits:
                    out[(q, code)] = (hits, len(nodes))
            frontier = nxt
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_golden_paths_match_a_brute_force_enumeration(seed):
    rng = np.random.default_rng(seed)
    (indptr, neighbors, relations), n, r = _random_graph(rng)
    seeds = np.array([[rng.integers(0, n), -1] if i % 2 else rng.integers(0, n, 2) for i in range(12)])
    answers = [sorted(set(rng.integers(0, n, 3).tolist())) for _ in range(12)]
    ptr = np.concatenate([[0], np.cumsum([len(a) for a in answers])])
    cfg = PriorConfig(neighbor_cap=10**6, path_cap=10**6)
    found = golden_paths(indptr, neighbors, relations, r, seeds, ptr, np.concatenate(answers), 3, cfg)
    got = {
        (int(q), int(c)): (int(h), int(m)) for q, c, h, m in zip(found["query"], found["code"], found["hits"], found["reached"])
    }
    assert got == _brute_force(indptr, neighbors, relations, 2 * r, seeds, answers, 3)
    assert len(got) > 10
    np.testing.assert_array_equal(found["length"], path_length(found["code"], 2 * r))

    # Batching does not change the result.
    class KG:
        pass

    kg = KG()
    kg.indptr, kg.neighbors, kg.edge_relations, kg.num_relations = indptr, neighbors, relations, r
    batched = golden_paths_batched(
        kg, seeds, ptr, np.concatenate(answers), 3, PriorConfig(neighbor_cap=10**6, path_cap=10**6, batch_queries=5)
    )
    for key in found:
        np.testing.assert_array_equal(found[key], batched[key], err_msg=key)
    # Nor with every path, answer or not (what the derivation of defaults searches).
    cfg = PriorConfig(neighbor_cap=10**6, path_cap=10**6, batch_queries=5)
    every = golden_paths(indptr, neighbors, relations, r, seeds, ptr, np.concatenate(answers), 3, cfg, every_path=True)
    every_batched = golden_paths_batched(kg, seeds, ptr, np.concatenate(answers), 3, cfg, every_path=True)
    assert len(every["code"]) > len(found["code"])
    for key in every:
        np.testing.assert_array_equal(every[key], every_batched[key], err_msg=key)


def test_caps_bound_the_work_of_a_hub():
    # Node 0 is a hub with 500 neighbours over relation 0; every neighbour is an answer.
    hub = 500
    src = np.zeros(hub, np.int64)
    dst = np.arange(1, hub + 1)
    indptr, neighbors, relations = build_csr(hub + 1, 1, src, dst, np.zeros(hub, np.int64))
    seeds = np.array([[0]])
    answers = np.arange(1, hub + 1)
    found = golden_paths(
        indptr, neighbors, relations, 1, seeds, np.array([0, hub]), answers, 2, PriorConfig(neighbor_cap=50, path_cap=20)
    )
    first = found["length"] == 1
    assert found["reached"][first].tolist() == [20] and found["hits"][first].tolist() == [20]


def test_codes_decode_and_describe():
    names = ["directed_by", "written_by", "directed_by (inverse)", "written_by (inverse)"]
    code = ((ROOT * 4 + 0) * 4 + 2) * 4 + 1
    assert decode(code, 4) == [0, 2, 1]
    short = ROOT * 4 + 3
    assert path_digits(np.array([code, short]), 4).tolist() == [[0, 2, 1], [3, -1, -1]]
    assert describe(code, names) == "directed_by -> directed_by (inverse) -> written_by"
    assert describe(ROOT, names) == "(seed)"
    with pytest.raises(ConfigError, match="lower expand.hops"):
        check_code_range(10_000, 6)


def test_encode_is_the_inverse_of_decode():
    for relations in ([], [0], [3, 1], [5, 0, 5]):
        code = encode(relations, 6)
        assert decode(code, 6) == relations and path_length(np.array([code]), 6).tolist() == [len(relations)]
    assert encode([], 6) == ROOT and encode([2, 0], 6) != encode([0, 2], 6)
