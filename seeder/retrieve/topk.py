"""Exact top-k nodes by cosine per query (paper, Section 3's dense seeds), in blocks of queries x nodes.

A running top-k keeps memory bounded at millions of nodes, ties break by node id, and an optional
bfloat16 screen (``seed.screen``) skips the float32 products of nodes that cannot enter the top k.
``seeder.retrieve.seeds`` seeds from it and ``seeder.retrieve.ann`` re-scores its candidates with it.
"""

from __future__ import annotations

import numpy as np

from seeder.config import ConfigError
from seeder.data.ragged import positions_within
from seeder.features.bfloat16 import from_bfloat16_bits
from seeder.system.mapped import release


def merge_topk(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k per row by (score descending, id ascending); padding (-1, -inf) sorts last."""
    pad = ids < 0
    order = np.lexsort((np.where(pad, np.iinfo(np.int64).max, ids), -scores), axis=-1)[:, :k]
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)


SCREENS = ("float32", "bfloat16")
BF16_ROUNDING = 2.0**-7
"""Bound on |bfloat16 product - exact product| for unit vectors: both inputs rounded to bfloat16 (8
significant bits, at most 2^-9 relative each, 2^-8 for a product of two) and the output rounded to
bfloat16 (2^-9 of a value of at most 1), with float32 accumulation in between: 2^-8 + 2^-9 < 2^-7."""
BF16_ROWS_ROUNDING = 2.0**-8
"""Bound on the same for a float32 product of float32 queries with node rows stored as bfloat16 (the
features stage's copy, ``seeder.features.bfloat16``): only the rows are rounded (2^-9 relative), with
room for their norms being taken after rounding."""


def resolve_screen(screen: str) -> str:
    """``seed.screen`` resolved: ``auto`` is ``bfloat16`` on a CPU with native bfloat16 products, else
    ``float32`` (emulated bfloat16 is slower than float32)."""
    if screen == "auto":
        from seeder.features.bert import native_bfloat16  # imports torch: only on this path

        return "bfloat16" if native_bfloat16() else "float32"
    if screen not in SCREENS:
        raise ConfigError(f"seed.screen={screen!r}: choose auto, {' or '.join(SCREENS)}")
    return screen


def screen_error(screen: str, dim: int, bfloat16_rows: bool = False) -> float:
    """How far a screen's score of two unit vectors can lie from ``row_cosines``' (per unit of
    ``|q| * |x|``): each sums ``dim`` float32 products, within ``dim * 2^-24`` of the true value in any
    order; a bfloat16 screen adds its rounding (``BF16_ROUNDING``), a float32 one over bfloat16 rows
    theirs (``BF16_ROWS_ROUNDING``)."""
    accumulation = 2 * dim * 2.0**-24
    if screen == "bfloat16":
        return accumulation + BF16_ROUNDING
    return accumulation + (BF16_ROWS_ROUNDING if bfloat16_rows else 0.0)


def _kth_largest(scores, rows: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest screen score of each of ``rows`` (numpy float32 or torch bfloat16 scores: each
    kind stays in its own library, whose thread pool would otherwise fight the other's)."""
    if isinstance(scores, np.ndarray):
        return -np.partition(-scores[rows], k - 1, axis=1)[:, k - 1]
    import torch  # torch only on this path

    return torch.topk(scores[torch.from_numpy(rows)], k, dim=1).values[:, -1].float().numpy()


def _at_least(scores, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the screen scores at or above their row's ``threshold``, rows ascending."""
    if isinstance(scores, np.ndarray):
        live = np.flatnonzero(scores.max(axis=1) >= threshold)  # a fast reduction first
        sub_rows, cols = np.nonzero(scores[live] >= threshold[live, None])
        return live[sub_rows], cols
    import torch  # torch only on this path

    limit = torch.from_numpy(threshold.astype(np.float32))
    live = torch.nonzero(scores.amax(dim=1) >= limit).flatten()
    sub_rows, cols = torch.nonzero(scores[live] >= limit[live, None], as_tuple=True)
    return live[sub_rows].numpy(), cols.numpy()


def dense_seeds(
    query_features: np.ndarray,
    node_features: np.ndarray,
    k0: int,
    block_nodes: int = 131_072,
    block_queries: int = 512,
    screen: str = "auto",
    screen_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k0`` nodes by cosine for every query: (ids int64 [Q, k0], scores float32 [Q, k0]).

    Features are L2-normalised, so the dot product is the cosine. Rows are best first, ties broken by
    the smaller node id; with fewer than k0 nodes the rest is padded with id -1 and score -inf.
    ``node_features`` may be a memmap: it is read once, one block of ``block_nodes`` rows at a time,
    each block scored against every query, ``block_queries`` at a time, and then released from this
    process (``seeder.system.mapped.release``), so neither the features nor more than ``block_queries x
    block_nodes`` scores are ever resident at once.

    Each block is first scored by a matrix product in ``screen`` precision (``resolve_screen``; a
    bfloat16 product runs 2-3x as fast as float32 on a CPU with native bfloat16). Only the nodes whose
    screen score comes within ``screen_error`` of the query's running k-th best are scored again
    exactly (``row_cosines``), and the top-k is kept on those: a node of the true top-k can never be
    screened out, so the result is the same in either precision, bit for bit.

    ``screen_rows``, when given, is the features' bfloat16 copy (uint16 bits, ``node_features``' shape):
    the screen reads it instead of the float32 rows, and only the rows that pass it are read from
    ``node_features``. On a large graph that halves the bytes this scan pulls through the page cache
    and leaves the copy there for K-HOP's filter, which reads it next. The seeds stay bit for bit.
    """
    if k0 < 1:
        raise ConfigError(f"seed.k0 must be at least 1, got {k0}")
    if block_nodes < 1 or block_queries < 1:
        raise ConfigError("seed.block_nodes and seed.block_queries must be positive")
    screen = resolve_screen(screen)
    if screen == "bfloat16":
        import torch  # torch only on this path
    query_features = np.array(query_features, dtype=np.float32, order="C")  # writeable, for torch
    num_queries, num_nodes = len(query_features), len(node_features)
    if num_nodes and query_features.shape[1] != node_features.shape[1]:
        raise ValueError(f"query features have dimension {query_features.shape[1]} but node features {node_features.shape[1]}")
    if screen_rows is not None and (screen_rows.shape != node_features.shape or screen_rows.dtype != np.uint16):
        raise ValueError(
            f"screen_rows must be the node features' bfloat16 bits (uint16 {node_features.shape}), "
            f"got {screen_rows.dtype} {screen_rows.shape}"
        )
    bfloat16_rows = screen_rows is not None
    error = screen_error(screen, query_features.shape[1], bfloat16_rows) * np.linalg.norm(query_features, axis=1)
    screen_queries = torch.from_numpy(query_features).to(torch.bfloat16) if screen == "bfloat16" else None
    best_ids = np.full((num_queries, k0), -1, dtype=np.int64)
    best_scores = np.full((num_queries, k0), -np.inf, dtype=np.float32)
    for n_start in range(0, num_nodes, block_nodes):
        view = (screen_rows if bfloat16_rows else node_features)[n_start : n_start + block_nodes]
        if bfloat16_rows and screen == "bfloat16":  # the bits are bfloat16 already: no rounding, no widening
            screen_block = torch.from_numpy(np.array(view)).view(torch.bfloat16).T
            block = screen_block.T.float().numpy()
        else:
            block = from_bfloat16_bits(view) if bfloat16_rows else np.ascontiguousarray(view, dtype=np.float32)
            # A memmap's rows are read-only, and torch wraps only writeable arrays.
            screen_block = (
                torch.from_numpy(block if block.flags.writeable else block.copy()).to(torch.bfloat16).T
                if screen == "bfloat16"
                else None
            )
        widest = np.sqrt(np.einsum("ij,ij->i", block, block).max())
        for q_start in range(0, num_queries, block_queries):
            rows_of = slice(q_start, q_start + block_queries)
            queries = query_features[rows_of]
            scores = screen_queries[rows_of] @ screen_block if screen == "bfloat16" else queries @ block.T
            slack = error[rows_of] * widest
            # A node of the final top-k scores exactly at least the running k-th best, so its screen
            # score is at least that minus the slack...
            threshold = best_scores[rows_of, -1] - slack
            unfilled = np.flatnonzero(~np.isfinite(threshold))
            if len(unfilled):
                # ...and, while a query has fewer than k, it is in its block's exact top-k, whose k-th
                # exact score is at least the block's k-th screen score minus the slack.
                kth = _kth_largest(scores, unfilled, k0) if k0 < len(block) else -np.inf  # all are in
                threshold[unfilled] = kth - 2 * slack[unfilled]
            rows, cols = _at_least(scores, threshold)
            if len(rows) == 0:
                continue
            # The score of record, from float32 rows: the block's, or under a bfloat16 copy the candidates' own.
            found = cols.astype(np.int64) + n_start
            exact = row_cosines(queries, node_features, rows, found) if bfloat16_rows else row_cosines(queries, block, rows, cols)
            ids, values = pad_rows(rows, found, exact, len(queries))
            best_ids[rows_of], best_scores[rows_of] = merge_topk(
                np.concatenate([best_ids[rows_of], ids], axis=1),
                np.concatenate([best_scores[rows_of], values], axis=1),
                k0,
            )
        release(view)
    return best_ids, best_scores


def pad_rows(rows: np.ndarray, ids: np.ndarray, values: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat (row, id, value) entries, rows ascending -> [num_rows, widest row] padded with (-1, -inf)."""
    counts = np.bincount(rows, minlength=num_rows)
    within = positions_within(counts)
    out_ids = np.full((num_rows, int(counts.max())), -1, dtype=np.int64)
    out_values = np.full(out_ids.shape, -np.inf, dtype=np.float32)
    out_ids[rows, within], out_values[rows, within] = ids, values
    return out_ids, out_values


def row_cosines(query_features: np.ndarray, node_features: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """cos(query ``rows[i]``, node ``ids[i]``) for flat pairs (float32): the score of record of exact and
    approximate search alike, one float32 dot product per pair whatever block or batch it came in."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.float32)
    order = np.argsort(ids, kind="stable")  # sorted reads are kinder to a memmap
    nodes = np.asarray(node_features[ids[order]], dtype=np.float32)
    out = np.empty(len(ids), dtype=np.float32)
    out[order] = np.einsum("ij,ij->i", nodes, np.asarray(query_features, dtype=np.float32)[rows[order]])
    return out
