"""Training questions generated from a graph's own paths and texts (``seeder questions``).

Most graphs come with no questions whose answers are known. Their paths are questions already: from an
anchor node, a relation path ``r_1 .. r_l`` reaches a set of nodes, and "which nodes does X reach
through r_1, then r_2?" is answered exactly by that set. This module samples such questions:

- anchors in proportion to their degree (counted up to ``anchor_degree_cap``, so that hubs do not take
  every question), and from each a random walk of 1 to ``max_hops`` steps, each step a uniformly drawn
  edge of the current node (both directions): relations come in proportion to how the graph uses them;
- the answers are every node the walk's relation path reaches from the anchor (a breadth-first
  follow over the CSR), without the anchor; a path that reaches more than ``max_answers`` nodes is
  dropped as too broad;
- the text comes from the graph's own relation texts (``text`` forwards, ``inverse_text`` backwards)
  and the answer's node type, in several phrasings per path (``TEMPLATES``), so that a model learns a
  relation's meaning rather than one sentence; no phrase is specific to one dataset;
- a share of the multi-hop relation paths (``holdout_fraction``, chosen by a hash of the path) is never
  used for training questions: validation on them measures compositions not seen in training.

``build_dataset`` writes a new dataset with the same graph, the generated questions as its training
split (marked ``generated``, with their ``relation_path`` of CSR relation ids, ``anchor_id`` and
``phrasing``, the template's index; -1 and an empty path for the source's questions: the prior holds out
whole phrasings, seeder.retrieve.prior.held_out_questions), and the source's own val and test questions (plus
``real_train`` of its training questions, for few-label runs). Where the source has no val questions,
or ``source_val`` is false, questions over the held-out paths become the val split. A user's
paraphraser (``module:function`` taking and returning a list of question texts) may rewrite the texts,
for example with an LLM.

Everything is vectorised over questions as flat (question, node) arrays; only the hops are a loop.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.config import ConfigError, QuestionsConfig
from seeder.data.store import open_dataset, write_dataset
from seeder.retrieve.paths import first_of_runs, sampled_slices
from seeder.system.io import DataError

TEMPLATES = (
    "what {type} does {anchor} {chain}?",
    "{anchor} {chain} which {type}?",
    "which {type} is reached from {anchor} by {steps}?",
    "starting at {anchor}, follow {steps}: what {type} do you get?",
    "which {type} {back}?",
    "{back}: which {type}?",
    "which {type} {typed_back}?",
    "what is the {type} {typed_back}?",
    "{typed_front} which {type}?",
    "{typed_front} what?",
)
"""Phrasings of a question: ``chain`` reads the relations in order from the anchor ("directed by, which
wrote"), ``steps`` lists them ("directed by, then wrote"); ``back`` reads them from the answer's side,
each relation's inverse text, last hop first ("directed something that wrote X": people ask for the
answer by what it did); ``type`` is the answer's node type. ``typed_back`` and ``typed_front`` name each
node on the way by its type, as people do: "directed the movie starring X", "the movie starring X
directed by"."""

SHARE_STYLES = 4
"""Ways to name the node reached by a hop back along the relation just followed (X -starring-> a person
-starred in-> a movie): 0 as any other hop ("the movie starring the person starred in X"), 1 "the movie
whose person also starred in X", 2 "the movie that shares a person with X", 3 "the movie starring the
same person as X"."""

HASH_MULTIPLIER = np.uint64(2654435761)
OVERSAMPLE = 3
"""Walks sampled per question wanted: duplicates and paths that reach too many nodes are dropped, most
of all among the longest."""


def path_codes(paths: np.ndarray, lengths: np.ndarray, num_relation_ids: int) -> np.ndarray:
    """One int64 code per relation path, as seeder.retrieve.paths writes them (leading 1, base 2R)."""
    code = np.ones(len(paths), dtype=np.int64)
    for hop in range(paths.shape[1]):
        step = lengths > hop
        code[step] = code[step] * num_relation_ids + paths[step, hop]
    return code


def held_out(codes: np.ndarray, lengths: np.ndarray, fraction: float) -> np.ndarray:
    """Multi-hop paths held out of training, chosen by a hash of the path (the same on every run)."""
    unit = ((codes.astype(np.uint64) * HASH_MULTIPLIER) % np.uint64(2**32)).astype(np.float64) / 2**32
    return (lengths >= 2) & (unit < fraction)


def sample_walks(kg, cfg: QuestionsConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(anchors, relation paths [n, max_hops] padded with -1, lengths, the node each step reached [n,
    max_hops], -1 padded) of ``OVERSAMPLE * cfg.count`` walks."""
    indptr = np.asarray(kg.indptr, dtype=np.int64)
    degree = np.diff(indptr)
    weight = np.minimum(degree, cfg.anchor_degree_cap).astype(np.float64)
    if weight.sum() == 0:
        raise DataError(f"{kg.path}: the graph has no edges to generate questions from")
    walks = OVERSAMPLE * cfg.count
    anchors = rng.choice(kg.num_nodes, size=walks, p=weight / weight.sum())
    lengths = rng.integers(1, cfg.max_hops + 1, size=walks)
    paths = np.full((walks, cfg.max_hops), -1, dtype=np.int64)
    visits = np.full((walks, cfg.max_hops), -1, dtype=np.int64)
    current = anchors.copy()
    for hop in range(cfg.max_hops):
        walking = lengths > hop
        deg = degree[current]
        stuck = walking & (deg == 0)  # a dead end (only when reached through one direction): shorten
        lengths[stuck] = hop
        walking &= ~stuck
        pick = indptr[current] + np.floor(rng.random(walks) * np.maximum(deg, 1)).astype(np.int64)
        paths[walking, hop] = np.asarray(kg.edge_relations)[pick[walking]]
        current[walking] = np.asarray(kg.neighbors)[pick[walking]]
        visits[walking, hop] = current[walking]
    keep = lengths >= 1
    return anchors[keep], paths[keep], lengths[keep], visits[keep]


def follow(
    kg, anchors: np.ndarray, paths: np.ndarray, lengths: np.ndarray, neighbor_cap: int, max_answers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every node each question's relation path reaches from its anchor: (question, node) pairs sorted by
    question then node, and a mask of the questions whose reach stayed within ``max_answers`` at every hop."""
    indptr, neighbors, relations = kg.indptr, kg.neighbors, kg.edge_relations
    num_q = len(anchors)
    within = np.ones(num_q, dtype=bool)
    cur_q, cur_n = np.arange(num_q, dtype=np.int64), anchors.astype(np.int64)
    done_q, done_n = [], []
    for hop in range(paths.shape[1]):
        # A node with more neighbours than the cap is only sampled: its question's answers would not be
        # exact, so the question goes.
        within[cur_q[np.asarray(indptr[cur_n + 1]) - np.asarray(indptr[cur_n]) > neighbor_cap]] = False
        pos, owner = sampled_slices(indptr, cur_n, neighbor_cap)
        wanted = paths[cur_q, hop]
        ok = np.asarray(relations[pos]) == wanted[owner]
        q, n = cur_q[owner[ok]], np.asarray(neighbors[pos[ok]], dtype=np.int64)
        order = np.lexsort((n, q))
        q, n = q[order], n[order]
        first = first_of_runs(q, n)
        q, n = q[first], n[first]
        within &= np.bincount(q, minlength=num_q) <= max_answers
        q_ok = within[q]
        q, n = q[q_ok], n[q_ok]
        ends = lengths[q] == hop + 1
        done_q.append(q[ends])
        done_n.append(n[ends])
        cur_q, cur_n = q[~ends], n[~ends]
        if len(cur_q) == 0:
            break
    q, n = np.concatenate(done_q), np.concatenate(done_n)
    order = np.lexsort((n, q))
    return q[order], n[order], within


def phrase(
    kg,
    anchors: np.ndarray,
    paths: np.ndarray,
    lengths: np.ndarray,
    visit_types: np.ndarray,
    template_ids: np.ndarray,
    share_styles: np.ndarray,
) -> list[str]:
    """Question texts from the anchor's name, the relation texts along the path and the types of the
    nodes it reaches (``visit_types`` [n, max_hops]; the last one is the answer's type). ``share_styles``
    [n, max_hops] picks how a hop back along the previous relation is named (``SHARE_STYLES``)."""
    texts = np.array(kg.relation_texts, dtype=object)
    names = np.asarray(kg.node_names.to_numpy(zero_copy_only=False), dtype=object)[anchors]
    num_ids = len(texts)
    chains, steps, backs = [], [], []
    noun_phrases = [names]  # the node reached at each hop, named from the anchor: "the movie starring X"
    clauses = []  # what follows "the {type}" in each of those: "starring X"
    previous = np.full(len(anchors), -1, dtype=np.int64)
    for hop in range(paths.shape[1]):
        rel = np.where(paths[:, hop] >= 0, paths[:, hop], 0)
        has = lengths > hop
        words = np.where(has, texts[rel], "")
        chains.append(np.where(has, np.where(hop == 0, words, ", which " + words), ""))
        steps.append(np.where(has, np.where(hop == 0, words, ", then " + words), ""))
        # From the answer's side: the inverse of each hop (r <-> r + R), the first hop next to the anchor.
        inverse = np.where(has, texts[(rel + num_ids // 2) % num_ids], "")
        backs.insert(0, np.where(has, np.where(hop == 0, inverse + " ", inverse + " something that "), ""))
        clause = inverse + " " + noun_phrases[-1]
        if hop:
            # A hop back along the relation just followed reaches the nodes that share the middle one with
            # the node before it; people ask for those by what they share.
            shared = has & (rel == (previous + num_ids // 2) % num_ids) & (share_styles[:, hop] > 0)
            middle, before = visit_types[:, hop - 1], noun_phrases[-2]
            previous_inverse = texts[(previous + num_ids // 2) % num_ids]
            share = np.choose(
                np.maximum(share_styles[:, hop] - 1, 0),
                [
                    "whose " + middle + " also " + previous_inverse + " " + before,
                    "that shares a " + middle + " with " + before,
                    inverse + " the same " + middle + " as " + before,
                ],
            )
            clause = np.where(shared, share, clause)
        clauses.append(clause)
        noun_phrases.append("the " + visit_types[:, hop] + " " + clause)
        previous = rel
    chain = pc.binary_join_element_wise(*[pa.array(c.tolist(), pa.string()) for c in chains], "")
    step = pc.binary_join_element_wise(*[pa.array(s.tolist(), pa.string()) for s in steps], "")
    back = pc.binary_join_element_wise(
        *[pa.array(b.tolist(), pa.string()) for b in backs], pa.array(names.tolist(), pa.string()), ""
    )
    rows_all = np.arange(len(anchors))
    before_last = np.stack(noun_phrases, axis=1)[rows_all, lengths - 1]  # the node the last hop leaves from
    last = paths[rows_all, lengths - 1]
    typed_back = pa.array(np.stack(clauses, axis=1)[rows_all, lengths - 1].tolist(), pa.string())
    typed_front = pa.array((before_last + " " + texts[last]).tolist(), pa.string())
    answer_types = visit_types[rows_all, lengths - 1]
    out = np.empty(len(anchors), dtype=object)
    for t, template in enumerate(TEMPLATES):  # a handful of templates, each formatted over its rows at once
        rows = np.flatnonzero(template_ids == t)
        if len(rows) == 0:
            continue
        parts = {
            "anchor": pa.array(names[rows].tolist(), pa.string()),
            "chain": chain.take(pa.array(rows)),
            "steps": step.take(pa.array(rows)),
            "back": back.take(pa.array(rows)),
            "typed_back": typed_back.take(pa.array(rows)),
            "typed_front": typed_front.take(pa.array(rows)),
            "type": pa.array(answer_types[rows].tolist(), pa.string()),
        }
        pieces, rest = [], template
        while "{" in rest:
            before, _, after = rest.partition("{")
            key, _, rest = after.partition("}")
            pieces += [pa.scalar(before), parts[key]]
        pieces.append(pa.scalar(rest))
        out[rows] = pc.binary_join_element_wise(*pieces, "").to_pylist()
    return out.tolist()


def generate(kg, cfg: QuestionsConfig, paraphrase: Callable[[list[str]], list[str]] | None = None) -> dict[str, Any]:
    """Generated questions: ``anchors``, ``paths``, ``lengths``, ``answer_ptr``, ``answers``, ``texts``,
    ``phrasings`` (each one's template in ``TEMPLATES``), ``held_out`` (questions over held-out paths), in a
    fixed order for a given seed."""
    check(cfg)
    rng = np.random.default_rng(cfg.seed)
    anchors, paths, lengths, visits = sample_walks(kg, cfg, rng)
    num_ids = 2 * kg.num_relations
    codes = path_codes(paths, lengths, num_ids)
    # One question per (anchor, relation path).
    _, unique_rows = np.unique(np.stack([anchors, codes]), axis=1, return_index=True)
    unique_rows = np.sort(unique_rows)
    anchors, paths, lengths, codes, visits = (a[unique_rows] for a in (anchors, paths, lengths, codes, visits))
    q, n, within = follow(kg, anchors, paths, lengths, cfg.neighbor_cap, cfg.max_answers)
    not_anchor = n != anchors[q]
    q, n = q[not_anchor], n[not_anchor]
    counts = np.bincount(q, minlength=len(anchors))
    keep = within & (counts > 0)
    # Longer paths more often reach too many nodes: as many questions of each length as there are walks
    # for it, up to an even share of ``count`` (the walks are in random order, so the first ones).
    rank = np.zeros(len(keep), dtype=np.int64)
    for hops in range(1, cfg.max_hops + 1):
        of_length = np.flatnonzero(keep & (lengths == hops))
        rank[of_length] = np.arange(len(of_length))
    keep &= rank < -(-cfg.count // cfg.max_hops)
    index = np.cumsum(keep) - 1
    pair_keep = keep[q]
    q, n = index[q[pair_keep]], n[pair_keep]
    anchors, paths, lengths, codes, visits = (a[keep] for a in (anchors, paths, lengths, codes, visits))
    answer_ptr = np.zeros(len(anchors) + 1, dtype=np.int64)
    np.cumsum(np.bincount(q, minlength=len(anchors)), out=answer_ptr[1:])
    types = np.asarray(kg.table("nodes", ["type"]).column("type").to_numpy(zero_copy_only=False), dtype=object)
    types = np.where((types == None) | (types == ""), "node", types)  # noqa: E711
    visit_types = types[np.maximum(visits, 0)]
    # The answer's type is that of the first answer (the walk's own end is one of the answers too, but
    # the first keeps the questions as they were for graphs whose relations reach one type).
    if len(anchors):
        visit_types[np.arange(len(anchors)), lengths - 1] = types[n[answer_ptr[:-1]]]
    template_ids = rng.integers(len(TEMPLATES), size=len(anchors))
    share_styles = rng.integers(SHARE_STYLES, size=(len(anchors), cfg.max_hops))
    texts = phrase(kg, anchors, paths, lengths, visit_types, template_ids, share_styles)
    if paraphrase is not None:
        rewritten = list(paraphrase(list(texts)))
        if len(rewritten) != len(texts) or not all(isinstance(t, str) and t.strip() for t in rewritten):
            raise DataError(
                f"the paraphraser returned {len(rewritten)} texts for {len(texts)} questions, or empty "
                "ones; it must return one non-empty string per question, in order"
            )
        texts = rewritten
    return {
        "anchors": anchors,
        "paths": paths,
        "lengths": lengths,
        "codes": codes,
        "answer_ptr": answer_ptr,
        "answers": n,
        "texts": texts,
        "phrasings": template_ids,
        "held_out": held_out(codes, lengths, cfg.holdout_fraction),
    }


def check(cfg: QuestionsConfig) -> None:
    problems = []
    if cfg.count < 1 or cfg.max_hops < 1 or cfg.max_answers < 1 or cfg.anchor_degree_cap < 1 or cfg.neighbor_cap < 1:
        problems.append("count, max-hops, max-answers, anchor-degree-cap and neighbor-cap must be at least 1")
    if not 0 <= cfg.holdout_fraction < 1:
        problems.append("holdout-fraction must be in [0, 1)")
    if cfg.real_train < 0:
        problems.append("real-train must be >= 0")
    if problems:
        raise ConfigError("questions: " + "; ".join(problems))


def _real_questions(kg, real_train: int, seed: int, source_val: bool = True) -> pa.Table:
    """The source's test questions, its val ones with ``source_val``, and a seeded sample of ``real_train``
    training ones (not chosen by the id hash that seeder.preprocessing.derive samples with, or every one
    of them would be in its sample)."""
    queries = kg.queries
    split = queries.column("split").to_numpy(zero_copy_only=False)
    train_rows = np.flatnonzero(split == "train")
    kept_train = np.random.default_rng([seed, 1]).permutation(train_rows)[:real_train]
    evaluated = (split == "test") | ((split == "val") & source_val)
    rows = np.sort(np.concatenate([np.flatnonzero(evaluated), kept_train]))
    return queries.take(pa.array(rows))


def build_dataset(
    source: str | Path,
    out: str | Path,
    cfg: QuestionsConfig,
    overwrite: bool = False,
    paraphrase: Callable[[list[str]], list[str]] | None = None,
    echo=print,
) -> dict[str, Any]:
    """Write ``out``: the graph of ``source`` with generated training questions (see the module docstring)."""
    start = time.perf_counter()
    kg = open_dataset(source)
    made = generate(kg, cfg, paraphrase)
    real = _real_questions(kg, cfg.real_train, cfg.seed, cfg.source_val)
    has_val = "val" in set(real.column("split").to_pylist())
    use = ~made["held_out"] | (not has_val)  # held-out paths serve as val only where the source has none
    split = np.where(made["held_out"], "val", "train")[use]
    rows = np.flatnonzero(use)
    ptr = made["answer_ptr"]
    lengths = np.diff(ptr)[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = made["answers"][np.repeat(ptr[rows], lengths) + (np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths))]
    path_offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(made["lengths"][rows], out=path_offsets[1:])
    paths = made["paths"][rows]
    first_id = int(pc.max(kg.queries.column("id")).as_py() or 0) + 1 if kg.queries.num_rows else 0
    generated = pa.table(
        {
            "id": pa.array(first_id + np.arange(len(rows), dtype=np.int64)),
            "text": pa.array(np.asarray(made["texts"], dtype=object)[rows].tolist(), pa.string()),
            "answers": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int64())),
            "split": pa.array(split, pa.string()),
            "hop": pa.array(made["lengths"][rows].astype(np.int64)),
            "generated": pa.array(np.ones(len(rows), dtype=bool)),
            "relation_path": pa.ListArray.from_arrays(pa.array(path_offsets), pa.array(paths[paths >= 0].astype(np.int32))),
            "anchor_id": pa.array(made["anchors"][rows].astype(np.int64)),
            "phrasing": pa.array(made["phrasings"][rows].astype(np.int64)),
        }
    )
    real_part = pa.table(
        {
            "id": real.column("id"),
            "text": real.column("text"),
            "answers": real.column("answers"),
            "split": real.column("split"),
            "hop": real.column("hop").cast(pa.int64()) if "hop" in real.column_names else pa.nulls(real.num_rows, pa.int64()),
            "generated": pa.array(np.zeros(real.num_rows, dtype=bool)),
            "relation_path": pa.array([[]] * real.num_rows, pa.list_(pa.int32())),
            "anchor_id": pa.array(np.full(real.num_rows, -1, dtype=np.int64)),
            "phrasing": pa.array(np.full(real.num_rows, -1, dtype=np.int64)),
        }
    )
    queries = pa.concat_tables([real_part, generated])
    held = sorted(set(made["codes"][made["held_out"]].tolist()))
    source_info = {
        "format": "questions",
        "from": str(kg.path),
        "config": dataclasses.asdict(cfg),
        "held_out_paths": held,
        "generated": int(len(rows)),
        "real_kept": int(real.num_rows),
    }
    edges = kg.table("edges")
    # The graph is the source's: its triples keep their provenance, read by the version that read them.
    edge_sources = [
        {**entry, "dataset": entry.get("dataset") or kg.fingerprint} for entry in kg.manifest.get("edge_sources") or []
    ]
    write_dataset(
        out,
        kg.nodes,
        kg.relations,
        edges,
        queries,
        source=source_info,
        overwrite=overwrite,
        edge_sources=edge_sources if "source_file" in edges.column_names else None,
    )
    by_hop = np.bincount(made["lengths"][rows], minlength=cfg.max_hops + 1)[1:]
    per_hop = ", ".join(f"{c:,} of {h + 1} hop{'s' if h else ''}" for h, c in enumerate(by_hop))
    echo(
        f"questions: {len(rows):,} generated ({per_hop}; "
        f"{int((split == 'val').sum()):,} of them val over {len(held):,} held-out relation paths), "
        f"{real.num_rows:,} of the source's own kept, in {time.perf_counter() - start:.1f} s: {out}"
    )
    return source_info


def load_paraphraser(spec: str) -> Callable[[list[str]], list[str]]:
    """``module:function`` -> the function (it takes and returns a list of question texts)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"--paraphraser {spec!r}: write it as module:function, e.g. mypkg.rewrite:paraphrase")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--paraphraser {spec}: cannot load it ({exc}); is the module on PYTHONPATH?") from None
