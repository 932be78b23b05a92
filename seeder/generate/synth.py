"""Synthetic relation-tracing graphs (SeedER paper, Appendix B, Definition B.1), made realistic.

Definition B.1: ``k`` relation types, each a uniform random permutation ``sigma_r`` of the ``N``
nodes (an edge ``u -r-> sigma_r(u)``); a query is a start node ``s`` and a relation sequence
``r_1..r_l`` (``1 <= l <= L``); its answer is ``sigma_{r_l}(...sigma_{r_1}(s))``. Every answer is
unique and correct by construction, and reaching it needs exactly ``l`` hops.

On top of that definition:

- Typed nodes with unique pronounceable names (syllables from a scrambled id, so neighbours do not
  look alike) and a short text ``"Bakilo: a city"``.
- Readable relation names (``capital of``, ``mentor of`` ...) and questions that name the start node
  and the relations, last hop first: ``"What is the capital of the mentor of Bakilo?"``. Dense
  retrieval can find the start node; the answer's text shares no word with the question but generic
  ones (``the``, ``a``, a type word).
- Hubs (``hubs``): a few nodes with an extra relation ``features`` to ``hub_degree`` random nodes each,
  so expansion meets high-degree nodes. Queries never use it, so answers stay exact.
- Multi-answer queries (``multi_answer_frac``): one extra relation ``associate of`` is the union of
  ``multi_answer_fanout`` further permutations ``pi_1..pi_c`` (each node has up to ``c`` associates).
  A multi-answer query ends with that hop; its answers are ``{pi_j(x)}`` for the node ``x`` reached
  before it, again exact by construction.
- Fan-out queries (``fanout_frac``): every hop is ``associate of``, so an ``l``-hop query's path reaches
  up to ``c``, ``c^2`` ... ``c^l`` nodes and its answers are all of the last hop's (a queries column
  ``fanout`` marks them).
- Text-conditioned queries (``condition_frac``): the last hop is ``associate of`` and the question
  names a node type, ``"Which film is the associate of the mentor of Bakilo?"``: the answers are the
  associates of that type (at least one, as the type is drawn from them; a queries column
  ``conditioned`` marks them). The relation path reaches every associate alike; only the question's
  text against each candidate's own text (``"Kazuri: a film"``) tells them apart.

Everything is vectorised numpy/pyarrow and deterministic from ``seed``: the same parameters give the
same bytes in every Parquet file.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.config import ConfigError, SynthConfig, from_dict, load_config
from seeder.data.importers import progress
from seeder.data.store import write_dataset
from seeder.system.io import writes_output

KINDS = ["city", "person", "company", "river", "mountain", "film", "book", "planet", "team", "festival", "ship", "island"]
RELATION_PHRASES = [
    "capital of",
    "mentor of",
    "rival of",
    "partner of",
    "successor of",
    "origin of",
    "sponsor of",
    "owner of",
    "founder of",
    "twin of",
    "patron of",
    "heir of",
    "ally of",
    "source of",
    "guardian of",
    "neighbor of",
    "critic of",
    "student of",
    "designer of",
    "keeper of",
]
MULTI_PHRASE = "associate of"
HUB_NAME = "features"
CONSONANTS = list("bdfgklmnprstvz")
VOWELS = list("aeiou")
SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 70
NAME_MULTIPLIER = 1_000_003  # prime, coprime with 70**d: the id scramble is a bijection


def relation_phrases(k: int) -> list[str]:
    return [RELATION_PHRASES[i] if i < len(RELATION_PHRASES) else f"link {i} of" for i in range(k)]


def node_names(n: int, rng: np.random.Generator) -> pa.Array:
    """Unique capitalised pseudo-words: the digits of an affine scramble of the id, base 70, as syllables."""
    base = len(SYLLABLES)
    digits = max(3, math.ceil(math.log(max(n, 2), base)))
    modulus = base**digits
    offset = int(rng.integers(modulus))
    code = (np.arange(n, dtype=np.int64) * NAME_MULTIPLIER + offset) % modulus
    syllables = pa.array(SYLLABLES)
    parts = []
    for d in range(digits):
        parts.append(syllables.take(pa.array((code // base**d) % base)))
    word = pc.binary_join_element_wise(*parts, "")
    return pc.utf8_capitalize(word)


def check(cfg: SynthConfig) -> None:
    problems = []
    if cfg.nodes < 2:
        problems.append("nodes must be at least 2")
    if cfg.relations < 1:
        problems.append("relations must be at least 1")
    if cfg.max_path_length < 1:
        problems.append("max-path-length must be at least 1")
    if cfg.queries < 1:
        problems.append("queries must be at least 1")
    if not 0 <= cfg.multi_answer_frac <= 1:
        problems.append("multi-answer-frac must be in [0, 1]")
    if not 0 <= cfg.fanout_frac <= 1 or cfg.multi_answer_frac + cfg.fanout_frac > 1:
        problems.append("fanout-frac must be in [0, 1], and at most 1 together with multi-answer-frac")
    if not 0 <= cfg.condition_frac <= 1 or cfg.multi_answer_frac + cfg.fanout_frac + cfg.condition_frac > 1:
        problems.append("condition-frac must be in [0, 1], and at most 1 with multi-answer-frac and fanout-frac")
    if cfg.multi_answer_fanout < 2 and (cfg.multi_answer_frac > 0 or cfg.fanout_frac > 0 or cfg.condition_frac > 0):
        problems.append("multi-answer-fanout must be at least 2")
    if cfg.hubs < 0 or cfg.hubs > cfg.nodes or cfg.hub_degree < 0:
        problems.append("hubs must be in 0..nodes and hub-degree >= 0")
    if not (0 <= cfg.val_fraction and 0 <= cfg.test_fraction and cfg.val_fraction + cfg.test_fraction < 1):
        problems.append("val and test fractions must be >= 0 and sum below 1")
    if problems:
        raise ConfigError("synth: " + "; ".join(problems))


def generate(cfg: SynthConfig) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """The four store tables of a synthetic graph (see the module docstring)."""
    check(cfg)
    rng = np.random.default_rng(cfg.seed)
    n, k, big_l = cfg.nodes, cfg.relations, cfg.max_path_length
    index_type = np.int32 if n < 2**31 else np.int64

    kinds = np.array(KINDS, dtype=object)
    kind_index = rng.integers(len(KINDS), size=n)
    kind = pa.array(kinds[kind_index], pa.string())
    names = node_names(n, rng)
    nodes = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "type": kind,
            "name": names,
            "text": pc.binary_join_element_wise(names, kind, ": a "),
        }
    )

    # Definition B.1: sigma_r, one permutation per relation.
    sigma = np.empty((k, n), dtype=index_type)
    for r in range(k):
        sigma[r] = rng.permutation(n)
    phrases = relation_phrases(k)
    rel_names, rel_texts, rel_inverse = list(phrases), list(phrases), [f"has {p.removesuffix(' of')}" for p in phrases]
    src_parts = [np.tile(np.arange(n, dtype=np.int64), k)]
    dst_parts = [sigma.reshape(-1).astype(np.int64)]
    rel_parts = [np.repeat(np.arange(k, dtype=np.int32), n)]

    multi_rel = -1
    if cfg.multi_answer_frac > 0 or cfg.fanout_frac > 0 or cfg.condition_frac > 0:
        multi_rel = len(rel_names)
        pi = np.empty((cfg.multi_answer_fanout, n), dtype=index_type)
        for j in range(cfg.multi_answer_fanout):
            pi[j] = rng.permutation(n)
        # One edge per distinct associate: drop pi_j(u) that repeats an earlier pi_i(u).
        repeated = np.zeros_like(pi, dtype=bool)
        for j in range(1, pi.shape[0]):
            repeated[j] = (pi[:j] == pi[j]).any(axis=0)
        keep = ~repeated
        src_parts.append(np.broadcast_to(np.arange(n, dtype=np.int64), pi.shape)[keep])
        dst_parts.append(pi[keep].astype(np.int64))
        rel_parts.append(np.full(int(keep.sum()), multi_rel, dtype=np.int32))
        rel_names.append(MULTI_PHRASE)
        rel_texts.append(MULTI_PHRASE)
        rel_inverse.append("has associate")

    if cfg.hubs > 0 and cfg.hub_degree > 0:
        hub_rel = len(rel_names)
        hubs = rng.choice(n, size=cfg.hubs, replace=False)
        degree = min(cfg.hub_degree, n - 1)
        # Distinct targets per hub without a per-hub loop: the top-`degree` of random keys per row.
        if degree * 4 >= n:
            keys = rng.random((cfg.hubs, n))
            keys[np.arange(cfg.hubs), hubs] = 2.0  # never the hub itself
            targets = np.argsort(keys, axis=1)[:, :degree]
        else:
            targets = rng.integers(n, size=(cfg.hubs, degree * 2))
            targets = np.sort(targets, axis=1)
            dup = np.zeros_like(targets, dtype=bool)
            dup[:, 1:] = targets[:, 1:] == targets[:, :-1]
            dup |= targets == hubs[:, None]
            # Unique, non-self targets first, then take `degree` of them (2x oversampling is ample
            # when degree << n; a shortfall only means a hub with slightly fewer extra edges).
            order = np.argsort(dup, axis=1, kind="stable")
            targets = np.take_along_axis(targets, order, axis=1)[:, :degree]
            valid = ~np.take_along_axis(dup, order, axis=1)[:, :degree]
            targets = np.where(valid, targets, -1)
        hub_src = np.repeat(hubs.astype(np.int64), targets.shape[1])
        hub_dst = targets.reshape(-1).astype(np.int64)
        ok = hub_dst >= 0
        src_parts.append(hub_src[ok])
        dst_parts.append(hub_dst[ok])
        rel_parts.append(np.full(int(ok.sum()), hub_rel, dtype=np.int32))
        rel_names.append(HUB_NAME)
        rel_texts.append(HUB_NAME)
        rel_inverse.append("featured by")

    edges = pa.table({"src": np.concatenate(src_parts), "dst": np.concatenate(dst_parts), "relation": np.concatenate(rel_parts)})
    relations = pa.table(
        {
            "id": pa.array(np.arange(len(rel_names), dtype=np.int32)),
            "name": [r.replace(" ", "_") for r in rel_names],
            "text": rel_texts,
            "inverse_text": rel_inverse,
        }
    )

    # Queries: start node, length, relation sequence; the last hop of a multi-answer query is `associate of`.
    q = cfg.queries
    start = rng.integers(n, size=q)
    length = rng.integers(1, big_l + 1, size=q)
    path = rng.integers(k, size=(q, big_l)).astype(np.int32)
    multi = (rng.random(q) < cfg.multi_answer_frac) if multi_rel >= 0 else np.zeros(q, dtype=bool)
    fanout = np.zeros(q, dtype=bool)
    if cfg.fanout_frac > 0:  # drawn only then: graphs without fan-out keep their bytes
        u = rng.random(q)
        fanout = (u < cfg.fanout_frac) & ~multi
        path[fanout] = multi_rel
    conditioned = np.zeros(q, dtype=bool)
    if cfg.condition_frac > 0:  # likewise
        conditioned = (rng.random(q) < cfg.condition_frac) & ~multi & ~fanout
        condition_pick = rng.integers(cfg.multi_answer_fanout, size=q)
    rows = np.arange(q)
    ends_associate = multi | conditioned
    path[rows[ends_associate], length[ends_associate] - 1] = multi_rel
    path[np.arange(big_l)[None, :] >= length[:, None]] = -1

    current = start.astype(np.int64)
    for hop in range(big_l):
        step = path[:, hop]
        follow = (step >= 0) & (step != multi_rel)
        current[follow] = sigma[step[follow], current[follow]]
    single_answers = current[:, None]
    if ends_associate.any():
        associates = pi[:, current].T.astype(np.int64)  # [q, c]
        if conditioned.any():  # the type of one associate, so that at least one answer has it
            wanted = kind_index[associates[rows, condition_pick]]
        associates = np.sort(associates, axis=1)
        distinct = np.ones_like(associates, dtype=bool)
        distinct[:, 1:] = associates[:, 1:] != associates[:, :-1]
        keep = np.where(multi[:, None], distinct, np.arange(associates.shape[1])[None, :] == 0)
        if conditioned.any():
            keep[conditioned] = distinct[conditioned] & (kind_index[associates[conditioned]] == wanted[conditioned, None])
        counts = keep.sum(axis=1)
        flat = np.where(ends_associate[:, None], associates, single_answers)[keep]
    else:
        counts = np.ones(q, dtype=np.int64)
        flat = current
    if fanout.any():
        counts, flat = _with_fanout_answers(counts, flat, fanout, start, length, pi)
    offsets = np.zeros(q + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    answers = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int64()))

    # Text, last hop first: "What is the capital of the mentor of Bakilo?"
    phrase_table = pa.array(rel_texts + [""], pa.string())
    opening = np.where(multi | fanout, "Which entities are ", "What is ").astype(object)
    if conditioned.any():
        opening[conditioned] = "Which " + kinds[wanted[conditioned]] + " is "
    pieces = [pa.array(opening, pa.string())]
    for hop in range(big_l - 1, -1, -1):
        step = path[:, hop]
        phrase = phrase_table.take(pa.array(np.where(step >= 0, step, len(rel_texts))))
        pieces.append(pc.if_else(pa.array(step >= 0), pc.binary_join_element_wise("the ", phrase, " ", ""), ""))
    pieces.append(names.take(pa.array(start)))
    pieces.append(pa.scalar("?"))
    text = pc.binary_join_element_wise(*pieces, "")

    u = rng.random(q)
    split = np.where(u < cfg.test_fraction, "test", np.where(u < cfg.test_fraction + cfg.val_fraction, "val", "train"))
    path_offsets = np.zeros(q + 1, dtype=np.int32)
    np.cumsum(length, out=path_offsets[1:])
    queries = pa.table(
        {
            "id": pa.array(np.arange(q, dtype=np.int64)),
            "text": text,
            "answers": answers,
            "split": pa.array(split, pa.string()),
            "hop": pa.array(length.astype(np.int64)),
            "start": pa.array(start.astype(np.int64)),
            "path": pa.ListArray.from_arrays(pa.array(path_offsets), pa.array(path[path >= 0], pa.int32())),
            "multi_answer": pa.array(multi),
        }
    )
    if cfg.fanout_frac > 0:
        queries = queries.append_column("fanout", pa.array(fanout))
    if cfg.condition_frac > 0:
        queries = queries.append_column("conditioned", pa.array(conditioned))
    return nodes, relations, edges, queries


def _with_fanout_answers(
    counts: np.ndarray, flat: np.ndarray, fanout: np.ndarray, start: np.ndarray, length: np.ndarray, pi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query answer lists (``counts``, ``flat``) with the fan-out queries' replaced by every node their
    ``associate of`` path reaches at its last hop (sorted, distinct)."""
    owner = np.repeat(np.arange(len(counts)), counts)
    keep = ~fanout[owner]
    owners, values = [owner[keep]], [np.asarray(flat, dtype=np.int64)[keep]]
    for hops in np.unique(length[fanout]):
        rows = np.flatnonzero(fanout & (length == hops))
        reached = start[rows, None].astype(np.int64)
        for _ in range(int(hops)):  # [rows, w] -> [rows, c * w]: each node's c associates
            reached = pi[:, reached].transpose(1, 0, 2).reshape(len(rows), -1).astype(np.int64)
        reached = np.sort(reached, axis=1)
        distinct = np.ones_like(reached, dtype=bool)
        distinct[:, 1:] = reached[:, 1:] != reached[:, :-1]
        owners.append(np.broadcast_to(rows[:, None], reached.shape)[distinct])
        values.append(reached[distinct])
    owner, value = np.concatenate(owners), np.concatenate(values)
    order = np.argsort(owner, kind="stable")  # rows in order, each row's answers as they were
    return np.bincount(owner, minlength=len(counts)), value[order]


@writes_output
def synthesize(cfg: SynthConfig, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Generate and write a synthetic dataset; returns timings and counts (also in the manifest)."""
    t0 = time.perf_counter()
    progress(f"synth: generating {cfg.nodes:,} nodes x {cfg.relations} relations, {cfg.queries:,} queries")
    nodes, relations, edges, queries = generate(cfg)
    t1 = time.perf_counter()
    progress(f"synth: {edges.num_rows:,} edges generated in {t1 - t0:.1f}s; writing {out}")
    source = {"format": "synth", "config": dataclasses.asdict(cfg)}
    write_dataset(out, nodes, relations, edges, queries, source=source, overwrite=overwrite)
    t2 = time.perf_counter()
    progress(f"synth: wrote {out} (validate + Parquet + CSR) in {t2 - t1:.1f}s")
    return {"generate_s": t1 - t0, "write_s": t2 - t1, "nodes": nodes.num_rows, "edges": edges.num_rows}


def load_synth_config(path: str | Path | None, overrides: dict[str, Any]) -> SynthConfig:
    """Defaults, then the ``synth`` section of a config file (e.g. configs/synth_default.yaml), then flags."""
    base = dataclasses.asdict(load_config(path).synth)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(SynthConfig, base, prefix="synth.")
