"""Training questions in the labelled questions' own words (``questions.rewordings``).

A few real questions say how users ask; generated ones (``seeder.generate.questions``) say it in
templates. Each labelled training question is also a template of its own: its topic entity, found by
name in its text (``seeder.retrieve.seeds.EntityLinker``), reaches its answers through a relation path
(its best golden path, ``seeder.retrieve.paths``). Put another node of the same type in the entity's
place and follow the same path from it: the result is a new question worded as a user words it, whose
answers are exactly the path's ends. This is template-based augmentation of KBQA data, with the
templates taken from the user's questions instead of written by hand.

What a rewording keeps and changes:

- the text is the labelled question's, normalised, with the topic entity's name replaced by the new
  anchor's (``seeder.retrieve.wording.mask_entities``);
- the path is the labelled question's best one by F1 against its answers, kept only where that F1 is
  at least ``MIN_F1`` (a path that explains the answers badly would teach a wrong reading);
- anchors are drawn uniformly among the nodes of the topic entity's type; a path that reaches no node or
  more than ``questions.max_answers`` from one is dropped, as for generated questions;
- rewordings are marked ``generated`` (a person did not answer them), so they neither vote
  (``prior.vote``) nor weigh as labelled questions (``prior.labelled_weight``).

Everything is vectorised over (question, anchor) rows; the linker's choice among one text's mentions is
its own loop.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from seeder.config import PriorConfig, QuestionsConfig, SeedConfig
from seeder.retrieve.paths import ROOT, golden_paths_batched, path_length
from seeder.retrieve.seeds import EntityLinker, normalise_texts
from seeder.retrieve.wording import mask_entities

MIN_F1 = 0.5
"""A labelled question lends its wording only through a path whose ends match its answers this well."""


def best_paths(
    kg, seeds: np.ndarray, answer_ptr: np.ndarray, answers: np.ndarray, max_hops: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per question (one seed each, -1 none): the code of its best golden path by F1 (the shorter on a tie)
    and that F1; code ``ROOT`` and F1 0 where no path reaches an answer."""
    found = golden_paths_batched(kg, seeds[:, None], answer_ptr, answers, max_hops, PriorConfig())
    num_answers = np.diff(answer_ptr)[found["query"]]
    f1 = 2.0 * found["hits"] / np.maximum(found["reached"] + num_answers, 1)
    # Rows are sorted by (question, code); a stable sort by -F1 keeps the shorter path first on a tie.
    order = np.lexsort((found["code"], -f1, found["query"]))
    first = np.ones(len(order), dtype=bool)
    first[1:] = found["query"][order][1:] != found["query"][order][:-1]
    best = order[first]
    code = np.full(len(seeds), ROOT, dtype=np.int64)
    score = np.zeros(len(seeds))
    code[found["query"][best]] = found["code"][best]
    score[found["query"][best]] = f1[best]
    return code, score


def decode_paths(codes: np.ndarray, num_relation_ids: int, max_hops: int) -> tuple[np.ndarray, np.ndarray]:
    """Path codes -> (relation ids [n, max_hops] padded with -1, lengths)."""
    lengths = path_length(codes, num_relation_ids).astype(np.int64)
    paths = np.full((len(codes), max_hops), -1, dtype=np.int64)
    rest = codes.copy()
    for hop in range(max_hops - 1, -1, -1):  # the last relation is the lowest digit
        here = lengths > hop
        paths[here, hop] = rest[here] % num_relation_ids
        rest[here] //= num_relation_ids
    return paths, lengths


def reworded(kg, labelled: pa.Table, cfg: QuestionsConfig, rng: np.random.Generator) -> dict:
    """``cfg.rewordings`` new questions for each of the ``labelled`` questions (text, answers) that names a
    node and has a path within ``MIN_F1``: arrays as ``seeder.generate.questions.generate`` returns them
    (``anchors``, ``paths``, ``lengths``, ``codes``, ``answer_ptr``, ``answers``, ``texts``) and ``source``."""
    from seeder.generate.questions import OVERSAMPLE, follow  # one module each way would be a cycle

    texts = labelled.column("text").to_pylist()
    linked = EntityLinker(kg, SeedConfig(strategy="dense+entity", entity_max=1, entity_min_chars=1)).link(texts)
    topic = np.array([ids[0] if len(ids) else -1 for ids in linked], dtype=np.int64)
    answer_lists = labelled.column("answers")
    answer_ptr = np.asarray(answer_lists.combine_chunks().offsets, dtype=np.int64)
    answers = np.asarray(answer_lists.combine_chunks().values, dtype=np.int64)
    code, f1 = best_paths(kg, topic, answer_ptr, answers, cfg.max_hops)
    names = kg.node_names
    # The topic's name must stand in the text as words, or there is nothing to put another name in place of.
    normal = normalise_texts(texts).to_pylist()
    topic_normal = normalise_texts(names.take(pa.array(np.maximum(topic, 0))).to_pylist()).to_pylist()
    named = np.array([f" {n} " in f" {t} " for n, t in zip(topic_normal, normal)], dtype=bool)
    usable = np.flatnonzero((topic >= 0) & named & (code != ROOT) & (f1 >= MIN_F1))

    # Candidate anchors: OVERSAMPLE x rewordings nodes of each usable question's topic type, uniformly.
    types = np.asarray(kg.table("nodes", ["type"]).column("type").to_numpy(zero_copy_only=False), dtype=object)
    type_ids = np.unique(np.where(types == None, "", types).astype(str), return_inverse=True)[1]  # noqa: E711
    by_type = np.argsort(type_ids, kind="stable")
    type_start = np.concatenate([[0], np.cumsum(np.bincount(type_ids))])
    draws = OVERSAMPLE * cfg.rewordings
    source = np.repeat(usable, draws)
    t = type_ids[topic[source]]
    size = type_start[t + 1] - type_start[t]
    anchors = by_type[type_start[t] + np.floor(rng.random(len(source)) * size).astype(np.int64)]
    # One row per (question, anchor), never the question's own topic.
    keep = anchors != topic[source]
    source, anchors = source[keep], anchors[keep]
    _, first = np.unique(np.stack([source, anchors]), axis=1, return_index=True)
    first = np.sort(first)
    source, anchors = source[first], anchors[first]

    num_ids = 2 * kg.num_relations
    paths, lengths = decode_paths(code[source], num_ids, cfg.max_hops)
    q, n, within = follow(kg, anchors, paths, lengths, cfg.neighbor_cap, cfg.max_answers)
    not_anchor = n != anchors[q]
    q, n = q[not_anchor], n[not_anchor]
    ok = within & (np.bincount(q, minlength=len(anchors)) > 0)
    # The first ``rewordings`` that work for each labelled question (the draws are in random order).
    rank = np.zeros(len(ok), dtype=np.int64)
    kept = np.flatnonzero(ok)
    starts = np.r_[0, np.flatnonzero(np.diff(source[kept])) + 1]
    rank[kept] = np.arange(len(kept)) - np.repeat(starts, np.diff(np.r_[starts, len(kept)]))
    ok &= rank < cfg.rewordings
    index = np.cumsum(ok) - 1
    pair = ok[q]
    q, n = index[q[pair]], n[pair]
    source, anchors, paths, lengths = source[ok], anchors[ok], paths[ok], lengths[ok]
    answer_out = np.zeros(len(anchors) + 1, dtype=np.int64)
    np.cumsum(np.bincount(q, minlength=len(anchors)), out=answer_out[1:])
    topic_names = names.take(pa.array(topic[source])).to_pylist()
    anchor_names = names.take(pa.array(anchors)).to_pylist()
    new_texts = mask_entities([texts[i] for i in source], [[a] for a in topic_names], [[b] for b in anchor_names])
    return {
        "anchors": anchors,
        "paths": paths,
        "lengths": lengths,
        "codes": code[source],
        "answer_ptr": answer_out,
        "answers": n,
        "texts": new_texts,
        "source": source,  # the row of ``labelled`` each rewording rewords
    }
