"""Golden relation paths: which relation paths lead from a training question's seeds to its answers.

The supervision of the relation-path prior (seeder.retrieve.prior), in the spirit of SR (Zhang et
al., ACL 2022), Graph-S3 and RoE, which extract such paths offline from the gold answers. For every
query and every relation path p = (r_1, ..., r_l), l <= K, over both edge directions (inverse
relations are ``r + R``, as in the CSR), a bounded breadth-first search follows p from the seeds and
counts the nodes it reaches and how many of them are answers. Only paths that reach an answer are
kept.

A path is one int64 *code*: start from 1 and append each relation as a digit in base 2R,
``code = code * 2R + r``. The leading 1 keeps paths of different lengths apart (a code of length l lies
in [(2R)^l, 2 (2R)^l)), the parent path is ``code // 2R`` and the last relation ``code % 2R``.

Work caps, so that a hub costs no more than the cap:

- ``neighbor_cap``: of a node with more neighbours, a sample of its CSR slice is followed (its first
  ``neighbor_cap`` entries in edge-hash order, K-HOP-WITH-FILTERING's rule: ``sampled_slices``);
- ``path_cap``: per query and path, at most this many end nodes (the smallest ids) go on to the next
  hop and are counted.

Everything is vectorised over a batch of queries as flat (query, path, node) arrays; only the hops
are a Python loop.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from seeder.config import ConfigError, PriorConfig
from seeder.data.ragged import positions_within
from seeder.data.subgraphs import sorted_lookup

ROOT = 1
"""The code of the empty path (the seeds themselves)."""

GOLDEN_SCHEMA = pa.schema(
    [
        ("query_id", pa.int64()),
        ("length", pa.int8()),  # number of relations on the path
        ("code", pa.int64()),  # the path (see the module docstring)
        ("hits", pa.int32()),  # answers among the path's end nodes
        ("reached", pa.int32()),  # end nodes (at most path_cap)
        ("answers", pa.int32()),  # answers of the query
    ]
)


def max_code(num_relation_ids: int, length: int) -> int:
    return 2 * num_relation_ids**length


def check_code_range(num_relation_ids: int, length: int) -> None:
    if max_code(num_relation_ids, length) >= 2**62:
        raise ConfigError(
            f"relation paths of length {length} over {num_relation_ids} relation ids do not fit an int64 code; lower expand.hops"
        )


def encode(relations: list[int], num_relation_ids: int) -> int:
    """The path code of these relation ids, first hop first (``decode``'s inverse)."""
    code = ROOT
    for r in relations:
        code = code * num_relation_ids + int(r)
    return code


def decode(code: int, num_relation_ids: int) -> list[int]:
    """The relation ids of a path code, first hop first."""
    rels = []
    while code > ROOT:
        code, r = divmod(int(code), num_relation_ids)
        rels.append(r)
    return rels[::-1]


def path_digits(codes: np.ndarray, num_relation_ids: int) -> np.ndarray:
    """[n, longest] the relation id at each hop of each code (vectorised ``decode``), -1 past its end."""
    codes = np.asarray(codes, dtype=np.int64)
    length = path_length(codes, num_relation_ids)
    digits = np.full((len(codes), int(length.max(initial=0))), -1, np.int64)
    rest = codes.copy()
    for h in range(digits.shape[1] - 1, -1, -1):
        present = length > h
        digits[present, h] = rest[present] % num_relation_ids
        rest[present] //= num_relation_ids
    return digits


def path_length(codes: np.ndarray, num_relation_ids: int) -> np.ndarray:
    """Number of relations of each code (vectorised)."""
    codes = np.asarray(codes, dtype=np.int64)
    length = np.zeros(len(codes), dtype=np.int64)
    rest = codes.copy()
    while (rest > ROOT).any():
        more = rest > ROOT
        length[more] += 1
        rest[more] //= num_relation_ids
    return length


def describe(code: int, relation_names: list[str]) -> str:
    """``written_by -> written_by (inverse) -> starred_actors``-style text of a path code, given the
    names of all 2R relation ids (``KnowledgeGraph.relation_names``)."""
    return " -> ".join(relation_names[r] for r in decode(code, len(relation_names))) or "(seed)"


def sampled_slices(indptr: np.ndarray, nodes: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR positions of a sample of at most ``cap`` entries of each node's slice, and the node index of
    each: the slice's first ``cap`` entries, which ``build_csr`` orders by edge hash (a uniform sample
    that an added or removed edge moves only when it lies inside it). K-HOP-WITH-FILTERING's rule."""
    start = np.asarray(indptr[nodes], dtype=np.int64)
    sample = np.minimum(np.asarray(indptr[nodes + 1], dtype=np.int64) - start, cap)
    owner = np.repeat(np.arange(len(nodes)), sample)
    return start[owner] + positions_within(sample), owner


def first_of_runs(*sorted_columns: np.ndarray) -> np.ndarray:
    """Mask of the first row of each run of equal rows (columns already sorted together)."""
    n = len(sorted_columns[0])
    first = np.ones(n, dtype=bool)
    if n:
        same = np.ones(n - 1, dtype=bool)
        for col in sorted_columns:
            same &= col[1:] == col[:-1]
        first[1:] = ~same
    return first


def golden_paths(
    indptr: np.ndarray,
    neighbors: np.ndarray,
    relations: np.ndarray,
    num_relations: int,
    seeds: np.ndarray,
    answer_ptr: np.ndarray,
    answers: np.ndarray,
    max_length: int,
    cfg: PriorConfig,
    every_path: bool = False,
) -> dict[str, np.ndarray]:
    """Relation paths of length 1..``max_length`` from each query's seeds that reach an answer (with
    ``every_path``, also those that reach none).

    ``seeds`` is [Q, k0] padded with -1; ``answer_ptr``/``answers`` are the queries' answers (CSR).
    Returns flat arrays ``query`` (row in the batch), ``length``, ``code``, ``hits``, ``reached``, sorted
    by (query, code), which is also (query, length, code).
    """
    num_ids = 2 * num_relations
    check_code_range(num_ids, max_length)
    num_nodes = len(indptr) - 1
    num_q = len(seeds)
    answer_q = np.repeat(np.arange(num_q), np.diff(answer_ptr))
    answer_keys = np.unique(answer_q * num_nodes + np.asarray(answers, dtype=np.int64))
    out = {k: [] for k in ("query", "length", "code", "hits", "reached")}
    q, col = np.nonzero(np.asarray(seeds) >= 0)
    node = np.asarray(seeds, dtype=np.int64)[q, col]
    order = np.lexsort((node, q))
    q, node = q[order], node[order]
    keep = first_of_runs(q, node)
    q, node = q[keep].astype(np.int64), node[keep]
    code = np.full(len(q), ROOT, dtype=np.int64)
    for length in range(1, max_length + 1):
        if len(q) == 0:
            break
        pos, owner = sampled_slices(indptr, node, cfg.neighbor_cap)
        q = q[owner]
        code = code[owner] * num_ids + np.asarray(relations[pos], dtype=np.int64)
        node = np.asarray(neighbors[pos], dtype=np.int64)
        # One row per (query, path, node); per (query, path) the path_cap smallest node ids.
        order = np.lexsort((node, code, q))
        q, code, node = q[order], code[order], node[order]
        keep = first_of_runs(q, code, node)
        q, code, node = q[keep], code[keep], node[keep]
        group_start = first_of_runs(q, code)
        rank = positions_within(np.diff(np.r_[np.flatnonzero(group_start), len(q)]))
        keep = rank < cfg.path_cap
        q, code, node = q[keep], code[keep], node[keep]
        # Hits per (query, path).
        keys = q * num_nodes + node
        is_answer = sorted_lookup(answer_keys, keys)[0]
        starts = np.flatnonzero(first_of_runs(q, code))
        hits = np.add.reduceat(is_answer.astype(np.int64), starts) if len(starts) else np.zeros(0, np.int64)
        reached = np.diff(np.append(starts, len(q)))
        good = (hits > 0) | every_path
        out["query"].append(q[starts][good])
        out["length"].append(np.full(int(good.sum()), length, np.int8))
        out["code"].append(code[starts][good])
        out["hits"].append(hits[good].astype(np.int32))
        out["reached"].append(reached[good].astype(np.int32))
    empty = {"query": np.int64, "length": np.int8, "code": np.int64, "hits": np.int32, "reached": np.int32}
    flat = {k: (np.concatenate(v) if v else np.zeros(0, empty[k])) for k, v in out.items()}
    order = np.lexsort((flat["code"], flat["query"]))  # codes of shorter paths are smaller
    return {k: v[order] for k, v in flat.items()}


def golden_paths_batched(
    kg,
    seeds: np.ndarray,
    answer_ptr: np.ndarray,
    answers: np.ndarray,
    max_length: int,
    cfg: PriorConfig,
    every_path: bool = False,
) -> dict[str, np.ndarray]:
    """``golden_paths`` over ``cfg.batch_queries`` queries at a time: the same rows, while the flat arrays
    and their sorts stay small (on a graph of mean degree 22, 2,000 questions' 3-hop paths are tens of
    millions of rows at once)."""
    indptr, neighbors, relations = kg.indptr, kg.neighbors, kg.edge_relations
    parts = []
    step = max(cfg.batch_queries, 1)
    for lo in range(0, len(seeds), step):
        hi = min(lo + step, len(seeds))
        ptr = answer_ptr[lo : hi + 1]
        part = golden_paths(
            indptr,
            neighbors,
            relations,
            kg.num_relations,
            seeds[lo:hi],
            ptr - ptr[0],
            answers[ptr[0] : ptr[-1]],
            max_length,
            cfg,
            every_path=every_path,
        )
        part["query"] = part["query"] + lo
        parts.append(part)
    return (
        {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if parts
        else golden_paths(indptr, neighbors, relations, kg.num_relations, seeds[:0], answer_ptr[:1], answers[:0], max_length, cfg)
    )
