"""The relation-path prior: which relation path from the seed a question asks for, learnt from the
golden paths of the training questions (seeder.retrieve.paths).

The paper's K-HOP-WITH-FILTERING scores an edge's relation by its cosine to the question, which does
not know which relation the question asks for at which hop ("the actors of the films written by the
writer of X" must follow ``written_by``, then ``written_by`` backwards, then ``starred_actors``). SR
(Zhang et al., ACL 2022) trains a relation-path retriever from gold answers instead; this is that
idea in its smallest form:

- **Targets.** A question's target distribution puts weight F1(p) on each relation path p whose end
  nodes' F1 against the answers is at least ``prior.keep_ratio`` of its best path's F1.
- **Model.** A two-layer MLP from the PCA'd query embedding and the seeds' relation profile (which
  relation ids the seeds have edges of: the question rarely says which way to follow an edge, the
  seed's type does) to either one softmax per hop over the relation ids and "stop" (``prior.model:
  hops``, the default: a path's probability is the product along it, so a composition never seen whole
  in training still gets mass) or one softmax over a vocabulary of whole paths (``path``: captures how
  the hops depend on each other, but only for paths seen in training). Trained with the soft-target
  cross-entropy (a labelled question among generated ones counts ``prior.labelled_weight`` times); a
  hashed slice of the training questions is held out for early stopping. Paths whose first relation the
  seeds lack get no mass. A masked prior's probabilities are then multiplied by how well the question
  matches each path written as a question (``prior.path_text``, ``seeder.retrieve.path_text``), and with
  ``prior.vote: labelled`` the labelled training questions near the new one vote for their own paths
  (``seeder.retrieve.vote``). A masked prior also reads the node type the question asks for (an input
  of the MLP, and paths ending elsewhere are demoted: ``seeder.retrieve.answer_type``) and which
  relation it names first and last (``seeder.retrieve.local_match``); ``masked_reading`` is its reading.
- **Use.** The vocabulary's paths and all their prefixes form a trie. For a question, the *path term*
  of trie node t is the log of the probability mass of the vocabulary paths that start with t plus the
  mass of the path that ends at t. In K-HOP-WITH-FILTERING (``expand.relation_score: learned``) a candidate reached
  from a node on prefix t by relation r takes the path term of t + r: it inherits its path from its
  parent, so nodes on the predicted path outrank a hub's neighbourhood, and nodes where a likely path
  ends score highest. The log mass *ending* at a node's path is kept beside the subgraph
  (``path_end``) as a node feature of the policy: it marks where the predicted path stops, which the
  filter's path term (a prefix's mass includes all its continuations) does not.

Weights are plain arrays (``prior.npz``) beside a JSON description; inference is numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from seeder.config import ConfigError, PriorConfig, PriorModel, choices
from seeder.data.subgraphs import sorted_lookup
from seeder.retrieve.answer_type import AnswerTypes, asked_types, asked_words, one_hot
from seeder.retrieve.local_match import LocalMatch, question_windows
from seeder.retrieve.path_text import PathText
from seeder.retrieve.paths import ROOT, path_digits, path_length, sampled_slices
from seeder.retrieve.vote import LabelledVote
from seeder.retrieve.wording import WORDING_VERSION, masked_questions, question_form
from seeder.system.io import DataError


def path_targets(
    query: np.ndarray,
    code: np.ndarray,
    hits: np.ndarray,
    reached: np.ndarray,
    answers: np.ndarray,
    keep_ratio: float,
    num_relation_ids: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per golden-path row: keep it as a target of its query? Returns (rows kept, their weight, F1).

    ``answers`` is the query's answer count, per row. Rows must be sorted by (query, code). A path
    with a step straight back (``r`` then ``r`` inverse) that reaches as many nodes and answers as the
    same path without that step is a detour (over a one-to-one relation it returns to where it was)
    and is not a target, and neither is a path longer than the shortest one with the best F1.
    """
    precision = hits / np.maximum(reached, 1)
    recall = hits / np.maximum(answers, 1)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    if len(query) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), f1
    starts = np.flatnonzero(np.r_[True, query[1:] != query[:-1]])
    best = np.maximum.reduceat(f1, starts)
    best_per_row = np.repeat(best, np.diff(np.append(starts, len(query))))
    reduced = _without_first_backtrack(code, num_relation_ids)
    has_step_back = reduced != code
    # Look the reduced path up among the same query's rows (sorted by query, then code).
    span = int(code.max()) + 1
    keys = query.astype(np.int64) * span + code
    found, pos = sorted_lookup(keys, query.astype(np.int64) * span + reduced)
    same = found & (hits[pos] == hits) & (reached[pos] == reached)
    detour = has_step_back & same
    # No target is longer than the shortest path with the best F1: with many relations, long paths reach
    # an answer by coincidence (on a graph of permutations, a few of the 8,000 3-paths of a node do).
    length = path_length(code, num_relation_ids)
    at_best = f1 >= best_per_row * (1 - 1e-6)
    shortest_best = np.minimum.reduceat(np.where(at_best, length, np.iinfo(np.int64).max), starts)
    too_long = length > np.repeat(shortest_best, np.diff(np.append(starts, len(query))))
    kept = np.flatnonzero((f1 >= keep_ratio * best_per_row - 1e-12) & ~detour & ~too_long)
    return kept, f1[kept].astype(np.float32), f1


def _without_first_backtrack(code: np.ndarray, num_relation_ids: int) -> np.ndarray:
    """Each path code with its first "r then r inverse" pair of steps removed (unchanged if none)."""
    base, half = num_relation_ids, num_relation_ids // 2
    digits = path_digits(code, base)  # relation at hop 1..k, -1 beyond the path
    k = digits.shape[1]
    if k < 2:
        return code.copy()
    inverse = np.where(digits < half, digits + half, digits - half)
    back = (digits[:, 1:] >= 0) & (digits[:, 1:] == inverse[:, :-1])
    has_back = back.any(axis=1)
    at = np.where(has_back, back.argmax(axis=1), -2)  # the pair (at, at + 1) is dropped
    out = np.full(len(code), ROOT, np.int64)
    for j in range(k):  # hops only
        keep = (digits[:, j] >= 0) & (j != at) & (j != at + 1)
        out = np.where(keep, out * base + np.maximum(digits[:, j], 0), out)
    return np.where(has_back, out, code)


SEED_SAMPLE = 1024
"""At most this many CSR entries of one seed are read for its relation profile (its sample, ``paths.sampled_slices``)."""


def seed_relation_profile(indptr: np.ndarray, relations: np.ndarray, seeds: np.ndarray, num_relation_ids: int) -> np.ndarray:
    """[Q, 2R] 1.0 where some seed of the query has an edge of that relation id (either direction).

    The question alone often does not say which way an edge must be followed ("what did X direct":
    X is a director, so ``directed_by`` backwards); the seed's own relations do.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    q, col = np.nonzero(seeds >= 0)
    pos, owner = sampled_slices(indptr, seeds[q, col], SEED_SAMPLE)
    profile = np.zeros((len(seeds), num_relation_ids), dtype=np.float32)
    profile[q[owner], np.asarray(relations[pos], dtype=np.int64)] = 1.0
    return profile


def prior_inputs(query_features: np.ndarray, profile: np.ndarray, wording: np.ndarray | None = None) -> np.ndarray:
    """What the prior reads: the PCA'd query embedding, the question's wording around its seeds
    (``seeder.retrieve.wording``, when the prior uses it) and the seeds' relation profile (last)."""
    parts = [np.asarray(query_features, np.float32)]
    if wording is not None:
        parts.append(np.asarray(wording, np.float32))
    return np.concatenate([*parts, profile.astype(np.float32)], axis=1)


def masked_reading(
    texts: list[str],
    names: list[list[str]],
    types: list[list[str]],
    encode: Callable[[list[str]], np.ndarray],
    encode_raw: Callable[[list[str]], np.ndarray],
    type_names: list[str] | None,
    windows: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """What a ``prior.question: masked`` prior reads of each question, [Q, d (+ T) (+ 2d)]: the masked
    question's features (``encode``: texts -> the question features, PCA'd), then the one-hot type it
    asks for among ``type_names`` (``answer_type``; ``encode_raw``: texts -> the encoder's own
    embeddings), then its seed and asking windows' features (``local_match``, zeros for an empty
    window). Also the [Q] asked types (all -1 without ``type_names``). The preprocessing stage and the
    Retriever both read questions through here."""
    blocks = [np.asarray(encode(masked_questions(texts, names, types)), np.float32)]
    asked = np.full(len(texts), -1, np.int64)
    if type_names is not None:
        asked = asked_types(asked_words(texts), encode_raw, type_names)
        blocks.append(one_hot(asked, len(type_names)))
    if windows:
        for window in question_windows(texts, names, types):
            window = np.asarray(window, dtype=object)
            features = np.zeros_like(blocks[0])
            filled = np.flatnonzero(window != "")
            if len(filled):
                features[filled] = encode(window[filled].tolist())
            blocks.append(features)
    return np.concatenate(blocks, axis=1), asked


def _gelu(x: np.ndarray) -> np.ndarray:
    # The tanh form, the same as torch's approximate="tanh" used in training.
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x**3)))


@dataclass
class PathTrie:
    """The vocabulary's paths and all their prefixes; node 0 is the root (the seed)."""

    codes: np.ndarray  # int64 [T], sorted; codes[0] == ROOT
    children: np.ndarray  # int32 [T, 2R]: trie node of (t, r), or -1
    vocab_node: np.ndarray  # int64 [V]: trie node of each vocabulary path

    @classmethod
    def build(cls, vocab: np.ndarray, num_relation_ids: int) -> "PathTrie":
        vocab = np.asarray(vocab, dtype=np.int64)
        prefixes = [vocab]
        level = vocab
        while len(level):
            level = level[level > ROOT] // num_relation_ids
            prefixes.append(level)
        codes = np.unique(np.concatenate([np.array([ROOT], np.int64), *prefixes]))
        children = np.full((len(codes), num_relation_ids), -1, dtype=np.int32)
        nonroot = np.flatnonzero(codes > ROOT)
        parent = np.searchsorted(codes, codes[nonroot] // num_relation_ids)
        children[parent, codes[nonroot] % num_relation_ids] = nonroot
        return cls(codes=codes, children=children, vocab_node=np.searchsorted(codes, vocab))

    @property
    def num_nodes(self) -> int:
        return len(self.codes)

    def path_terms(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[Q, V] path probabilities -> ([Q, T] path term: mass of paths through t plus mass ending at
        t, [Q, T] mass ending at t)."""
        num_q = len(probs)
        through = np.zeros((self.num_nodes, num_q), dtype=np.float32)  # node-major for add.at on rows
        np.add.at(through, self.vocab_node, probs.T.astype(np.float32))
        ending = through.copy()
        # Push mass up one level at a time, deepest first (the codes' lengths give the levels).
        lengths = path_length(self.codes, self.children.shape[1])
        parent = np.searchsorted(self.codes, np.maximum(self.codes // self.children.shape[1], ROOT))
        for level in range(int(lengths.max(initial=0)), 0, -1):
            nodes = np.flatnonzero(lengths == level)
            np.add.at(through, parent[nodes], through[nodes])
        return (through + ending).T, ending.T


PRIOR_MODELS = choices(PriorModel)
MASS_FLOOR = 1e-6
OFF_PATH_TERM = float(np.log(MASS_FLOOR))
"""The path term of a candidate whose path leaves the prior's trie (no vocabulary path goes there)."""
OPTIONAL_PARTS = (("vote", LabelledVote), ("path_text", PathText), ("answer_types", AnswerTypes), ("local_match", LocalMatch))
"""The prior's optional parts, by attribute: each saves itself to its class's ``FILE`` in the prior's
directory, and ``load`` gives None where that file is absent."""


def all_paths(num_relation_ids: int, max_length: int) -> np.ndarray:
    """Every path code of length 1..max_length, ascending (level by level, first relation major)."""
    return np.concatenate(
        [num_relation_ids**h + np.arange(num_relation_ids**h, dtype=np.int64) for h in range(1, max_length + 1)]
    )


@dataclass
class RelationPathPrior:
    """MLP weights plus the path vocabulary; ``probs`` and ``path_terms`` run in numpy.

    ``model == "path"``: the output layer is one logit per vocabulary path. ``model == "hops"``: it is
    ``max_length`` blocks of 2R + 1 logits (the relation at hop h, or stop), and the vocabulary is every
    path of up to ``max_length`` relations: p(r_1..r_l) = prod_h p_h(r_h) * p_{l+1}(stop).
    """

    w1: np.ndarray  # [d, H]
    b1: np.ndarray  # [H]
    w2: np.ndarray  # [H, V] or [H, K (2R + 1)]
    b2: np.ndarray  # [V] or [K (2R + 1)]
    vocab: np.ndarray  # int64 [V] path codes
    num_relation_ids: int
    info: dict
    model: str = "path"
    max_length: int = 0
    bag_weight: float = 0.0
    wording_dim: int = 0  # width of the question_form block of the inputs (0: the prior does not read it)
    question: str = "text"  # prior.question: "masked" when its query features embed the masked questions
    vote: LabelledVote | None = None  # prior.vote: labelled questions' votes, multiplied in by ``probs``
    path_text: PathText | None = None  # prior.path_text: the paths written as questions, matched by ``probs``
    answer_types: AnswerTypes | None = None  # prior.answer_type: paths ending at another type than asked lose mass
    local_match: LocalMatch | None = None  # prior.local_match: seed and asking windows against first and last relations

    def inputs(
        self, query_features: np.ndarray, profile: np.ndarray, texts: list[str] | None, seed_names: list[list[str]] | None
    ) -> np.ndarray:
        """``prior_inputs`` for this prior: the wording block is computed when the prior was trained
        with one (then ``texts`` and ``seed_names`` are required)."""
        if not self.wording_dim:
            return prior_inputs(query_features, profile)
        if texts is None or seed_names is None:
            raise ConfigError("this relation-path prior reads the question texts (prior.wording_dim > 0); pass them")
        return prior_inputs(query_features, profile, question_form(texts, seed_names, self.wording_dim))

    @property
    def trie(self) -> PathTrie:
        if not hasattr(self, "_trie"):
            self._trie = PathTrie.build(self.vocab, self.num_relation_ids)
        return self._trie

    @property
    def first_relation(self) -> np.ndarray:
        """[V] the relation id each vocabulary path starts with."""
        codes = self.vocab.copy()
        while (codes >= self.num_relation_ids**2).any():
            deep = codes >= self.num_relation_ids**2
            codes[deep] //= self.num_relation_ids
        return codes % self.num_relation_ids

    def probs(self, inputs: np.ndarray) -> np.ndarray:
        """[Q, V] path probabilities from ``prior_inputs`` rows. Paths whose first relation is absent
        from the seeds' profile cannot be followed and get no mass (unless no path can)."""
        x = np.asarray(inputs, dtype=np.float32)
        read = x if self.local_match is None else np.delete(x, self.local_match.columns, axis=1)  # not the MLP's
        logits = _gelu(read @ self.w1 + self.b1) @ self.w2 + self.b2
        if self.model == "hops":
            e = self._path_products(logits)
        else:
            logits -= logits.max(axis=1, keepdims=True)
            e = np.exp(logits)
        profile = x[:, -self.num_relation_ids :]
        usable = profile[:, self.first_relation] > 0
        usable[~usable.any(axis=1)] = True
        e *= usable
        e /= e.sum(axis=1, keepdims=True)
        if self.path_text is not None:
            # The match reads the question features, the first block of the inputs, as the vote does.
            e = self.path_text.reweigh(e, x[:, : self.path_text.dim])
        if self.vote is not None:
            # The vote reads the same question features as the MLP: the first block of the inputs.
            e = self.vote.reweigh(e, x[:, : self.vote.features.shape[1]])
        if self.answer_types is not None:
            e = self.answer_types.reweigh(e, x)
        if self.local_match is not None:
            e = self.local_match.reweigh(e, x)
        return e

    def _path_products(self, logits: np.ndarray) -> np.ndarray:
        """[Q, K (2R+1)] per-hop logits -> [Q, V] probabilities of every path of up to K relations."""
        num_q, base, k = len(logits), self.num_relation_ids, self.max_length
        blocks = logits.reshape(num_q, k + 1, base + 1)
        blocks = np.exp(blocks - blocks.max(axis=2, keepdims=True))
        blocks /= blocks.sum(axis=2, keepdims=True)
        per_hop, bag = blocks[:, :k].copy(), blocks[:, k, :base]
        # Mix each hop's relation distribution with the order-free one (which relations the path uses),
        # keeping the hop's stop probability: where the encoder cannot tell the order of the relations a
        # question names, every order of them keeps some mass.
        go = 1.0 - per_hop[:, :, base]
        relations = per_hop[:, :, :base] / np.maximum(go, 1e-12)[:, :, None]
        relations = (1 - self.bag_weight) * relations + self.bag_weight * (bag / bag.sum(axis=1, keepdims=True))[:, None, :]
        per_hop[:, :, :base] = relations * go[:, :, None]
        levels, prefix = [], np.ones((num_q, 1), np.float32)
        for h in range(k):
            prefix = (prefix[:, :, None] * per_hop[:, h, None, :base]).reshape(num_q, -1)
            stop = per_hop[:, h + 1, base][:, None] if h + 1 < k else 1.0
            levels.append(prefix * stop)
        return np.concatenate(levels, axis=1)

    def path_terms(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[Q, T] log of (mass through + mass ending at) each trie node, and [Q, T] log of the mass
        ending at it, both floored at ``OFF_PATH_TERM``.

        In log space, so that the term compares paths by ratios and is not drowned by the filter's
        cosine terms when the mass is spread over many paths. The first steers the filter; the second
        says how likely a node at the end of that path is an answer, a feature of the policy."""
        path, ending = self.trie.path_terms(self.probs(inputs))
        return tuple(np.log(np.maximum(x, MASS_FLOOR)).astype(np.float32) for x in (path, ending))

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        np.savez(directory / "prior.npz", w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2, vocab=self.vocab)
        meta = {
            "num_relation_ids": self.num_relation_ids,
            "model": self.model,
            "max_length": self.max_length,
            "bag_weight": self.bag_weight,
            "wording_dim": self.wording_dim,
            "wording_version": WORDING_VERSION,
            "question": self.question,
        }
        (directory / "prior.json").write_text(json.dumps({**meta, **self.info}, indent=2))
        for name, part in OPTIONAL_PARTS:
            value = getattr(self, name)
            if value is not None:
                value.save(directory)
            else:
                (directory / part.FILE).unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: Path) -> "RelationPathPrior":
        directory = Path(directory)
        try:
            with np.load(directory / "prior.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in ("w1", "b1", "w2", "b2", "vocab")}
            info = json.loads((directory / "prior.json").read_text())
            parts = {name: part.load(directory) for name, part in OPTIONAL_PARTS}
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"{directory}: cannot read the relation-path prior ({exc}); rerun preprocessing") from exc
        if int(info.get("wording_dim", 0)) and info.get("wording_version") != WORDING_VERSION:
            raise DataError(
                f"{directory}: the relation-path prior was trained on question-wording features of version "
                f"{info.get('wording_version')}, this seeder computes version {WORDING_VERSION}; rerun "
                "preprocessing to retrain the prior and the subgraphs"
            )
        info.pop("wording_version", None)
        return cls(
            **arrays,
            num_relation_ids=int(info.pop("num_relation_ids")),
            model=info.pop("model", "path"),
            max_length=int(info.pop("max_length", 0)),
            bag_weight=float(info.pop("bag_weight", 0.0)),
            wording_dim=int(info.pop("wording_dim", 0)),
            question=str(info.pop("question", "text")),
            **parts,
            info=info,
        )


def train_prior(
    inputs: np.ndarray,
    query: np.ndarray,
    code: np.ndarray,
    weight: np.ndarray,
    query_ids: np.ndarray,
    num_relation_ids: int,
    cfg: PriorConfig,
    echo=print,
    wording_dim: int = 0,
    question_weight: np.ndarray | None = None,
    phrasings: np.ndarray | None = None,
) -> RelationPathPrior:
    """Fit the prior on target rows (query row, path code, weight) of training questions, then refit it
    ``prior.refine_rounds`` times on the same rows reweighted by the fitted prior's own probability
    of each path (hard-EM style, as weakly supervised semantic parsers pick among the programs that
    reach the answer).

    Gold answers alone cannot tell a question's path from the paths that reach its answers by
    coincidence: on a graph of permutations a few of a node's thousands of 3-relation paths do, at the
    same F1. Across questions, though, only the real path follows the wording; after one fit the
    coincidences get little probability, and the refit learns from the rest.

    ``inputs`` [Q, d + W + 2R] holds every training question's ``prior_inputs``, ``query_ids`` their ids
    and ``phrasings`` their generated phrasing or -1 (for the hold-out, ``held_out_questions``);
    ``wording_dim`` is W, the width of their wording block; ``question_weight``
    [Q] how much each question counts in the loss (1 for all when None). Questions without a target row
    are not used.
    """
    fit = dict(echo=echo, wording_dim=wording_dim, question_weight=question_weight, phrasings=phrasings)
    prior = _fit_prior(inputs, query, code, weight, query_ids, num_relation_ids, cfg, **fit)
    for _ in range(max(cfg.refine_rounds, 0)):
        questions, row = np.unique(query, return_inverse=True)
        probs = prior.probs(np.asarray(inputs[questions], dtype=np.float32))
        known, slot = sorted_lookup(prior.vocab, code)
        likely = np.where(known, probs[row, slot], 0.0) * weight
        total = np.bincount(row, likely, minlength=len(questions))
        # A question none of whose paths the prior knows keeps its weights.
        weight = np.where(total[row] > 0, likely / np.maximum(total[row], 1e-30), weight).astype(np.float32)
        # Warm-started from the first fit: early stopping ends the refit within a few epochs.
        prior = _fit_prior(inputs, query, code, weight, query_ids, num_relation_ids, cfg, **fit, start=prior)
    return prior


def id_hash(ids: np.ndarray) -> np.ndarray:
    """Knuth's multiplicative hash of ids into [0, 2^32): a stable pseudo-random order of them."""
    return (np.asarray(ids, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)


def holdout_mask(query_ids: np.ndarray, fraction: float) -> np.ndarray:
    """A stable pseudo-random share of the query ids (``id_hash``)."""
    return id_hash(query_ids) < np.uint64(int(fraction * 2**32))


def held_out_questions(query_ids: np.ndarray, fraction: float, phrasings: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """[n] which of these training questions (those with a target path) the prior's fit holds out for
    early stopping; the text-match weights are chosen on the same questions.

    Generated questions (``phrasings`` >= 0: their template, ``seeder questions``) are held out by whole
    phrasings, a seeded ``fraction`` of them (at least one): held-out questions worded as fitted ones
    reward the MLP's memory of the templates and undervalue the text matches that real questions need.
    Real questions (-1, or no ``phrasings``) are held out by the hashed share ``fraction``
    (``holdout_mask``). Where that holds out none or all of them, the first tenth is held out."""
    held = holdout_mask(query_ids, fraction)
    if phrasings is not None:
        phrasings = np.asarray(phrasings)
        made = phrasings >= 0
        kinds = np.unique(phrasings[made])
        if len(kinds) > 1:
            count = min(max(1, round(fraction * len(kinds))), len(kinds) - 1)
            chosen = np.random.default_rng(seed).permutation(kinds)[:count]
            held = np.where(made, np.isin(phrasings, chosen), held)
    if held.all() or not held.any():
        held = np.zeros(len(query_ids), bool)
        held[: max(1, len(query_ids) // 10)] = True
    return held


def _fit_prior(
    inputs: np.ndarray,
    query: np.ndarray,
    code: np.ndarray,
    weight: np.ndarray,
    query_ids: np.ndarray,
    num_relation_ids: int,
    cfg: PriorConfig,
    echo=print,
    wording_dim: int = 0,
    question_weight: np.ndarray | None = None,
    phrasings: np.ndarray | None = None,
    start: RelationPathPrior | None = None,
) -> RelationPathPrior:
    """One fit of the prior on weighted target rows (see ``train_prior``), from ``start``'s weights
    when given (same vocabulary)."""
    import torch  # torch only on this path

    if len(code) == 0:
        raise DataError(
            "no relation path leads from the training questions' seeds to their answers; "
            "use expand.relation_score=cosine, or check the seeds and expand.hops"
        )
    if cfg.model == "hops":
        # Every path of up to max_length relations; targets are per hop (relation or stop).
        max_length = int(path_length(code, num_relation_ids).max())
        vocab = all_paths(num_relation_ids, max_length)
        slot = np.searchsorted(vocab, code)
    else:
        # Vocabulary: the paths that are targets of the most questions.
        max_length = 0
        uniq, counts = np.unique(code, return_counts=True)
        order = np.lexsort((uniq, -counts))
        vocab = np.sort(uniq[order][counts[order] >= cfg.min_count][: cfg.max_paths])
        if len(vocab) == 0:
            raise DataError(
                f"no relation path is a target of prior.min_count={cfg.min_count} training questions; lower prior.min_count"
            )
        slot = np.searchsorted(vocab, code)
        in_vocab = vocab[np.minimum(slot, len(vocab) - 1)] == code
        query, slot, weight, code = query[in_vocab], slot[in_vocab], weight[in_vocab], code[in_vocab]
    rows = np.unique(query)
    row_of = np.full(len(inputs), -1, np.int64)
    row_of[rows] = np.arange(len(rows))
    # Which (question, vocabulary path) pairs are targets, for the held-out accuracy below.
    target_keys = np.unique(row_of[query] * len(vocab) + slot)
    if cfg.model == "hops":
        # Per hop h: the weight of target paths with relation r at hop h, or that stopped before h.
        stop = num_relation_ids
        hop_targets = np.zeros((len(rows), max_length, stop + 1), np.float32)
        lengths = path_length(code, num_relation_ids)
        digits = code.copy()
        for h in range(max_length, 0, -1):
            present = lengths >= h
            rel = np.where(present, digits % num_relation_ids, stop)
            digits = np.where(present, digits // num_relation_ids, digits)
            np.add.at(hop_targets, (row_of[query], h - 1, rel), weight)
        hop_targets /= hop_targets.sum(axis=2, keepdims=True)
        # The order-free block: how often each relation occurs on the target paths (never "stop").
        bag_targets = hop_targets.sum(axis=1)
        bag_targets[:, stop] = 0
        bag_targets /= np.maximum(bag_targets.sum(axis=1, keepdims=True), 1e-12)
        fit_targets = np.concatenate([hop_targets, bag_targets[:, None, :]], axis=1).reshape(len(rows), -1)
        out_width = (max_length + 1) * (stop + 1)
    else:
        fit_targets = np.zeros((len(rows), len(vocab)), dtype=np.float32)  # a small vocabulary of seen paths
        np.add.at(fit_targets, (row_of[query], slot), weight)
        fit_targets /= fit_targets.sum(axis=1, keepdims=True)
        out_width = len(vocab)
    x = np.asarray(inputs[rows], dtype=np.float32)
    held = held_out_questions(query_ids[rows], cfg.holdout_fraction, None if phrasings is None else phrasings[rows], cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    d, hidden = x.shape[1], cfg.hidden_dim
    net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(hidden, out_width))
    if start is not None:
        net.load_state_dict(
            {
                "0.weight": torch.from_numpy(start.w1.T.copy()),
                "0.bias": torch.from_numpy(start.b1),
                "2.weight": torch.from_numpy(start.w2.T.copy()),
                "2.bias": torch.from_numpy(start.b2),
            }
        )
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    w = np.ones(len(rows), np.float32) if question_weight is None else np.asarray(question_weight, np.float32)[rows]
    w /= w.max()  # equal weights become exactly 1: the same fit, bit for bit, as no weights
    xt, yt, wt = (torch.from_numpy(a[~held]) for a in (x, fit_targets, w))
    xv, yv, wv = (torch.from_numpy(a[held]) for a in (x, fit_targets, w))
    groups = max_length + 1 if cfg.model == "hops" else 1

    def loss_of(xb, yb, wb):
        # Soft-target cross-entropy, summed over the hops' softmaxes for the per-hop model; a weighted
        # mean over the questions.
        logits = net(xb).reshape(len(xb), groups, -1)
        per_question = -(yb.reshape(len(xb), groups, -1) * torch.log_softmax(logits, dim=2)).sum(dim=(1, 2))
        return (per_question * wb).sum() / wb.sum()

    best, best_state, stale, epoch = float("inf"), None, 0, 0
    for epoch in range(1, cfg.epochs + 1):
        net.train()
        perm = torch.randperm(len(xt), generator=gen)
        for lo in range(0, len(xt), cfg.batch_size):
            idx = perm[lo : lo + cfg.batch_size]
            opt.zero_grad()
            loss = loss_of(xt[idx], yt[idx], wt[idx])
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val = float(loss_of(xv, yv, wv))
        if val < best - 1e-4:
            best, stale = val, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            stale += 1
            if stale >= cfg.patience:
                break
    net.load_state_dict(best_state)
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    prior = RelationPathPrior(
        w1=sd["0.weight"].T.copy(),
        b1=sd["0.bias"].copy(),
        w2=sd["2.weight"].T.copy(),
        b2=sd["2.bias"].copy(),
        vocab=vocab,
        num_relation_ids=num_relation_ids,
        info={},
        model=cfg.model,
        max_length=max_length,
        bag_weight=cfg.bag_weight if cfg.model == "hops" else 0.0,
        wording_dim=wording_dim,
    )
    # Held-out accuracy: the predicted path (as used, seeds' profile applied) is one of the question's targets.
    top = prior.probs(x[held]).argmax(axis=1)
    held_rows = np.flatnonzero(held)
    wanted = held_rows * len(vocab) + top
    hit = sorted_lookup(target_keys, wanted)[0]
    info = {
        "vocab_size": int(len(vocab)),
        "questions": int(len(rows)),
        "held_out": int(held.sum()),
        "held_out_loss": round(best, 5),
        "held_out_top1_is_target": round(float(hit.mean()) if len(hit) else float("nan"), 4),
        "epochs": epoch,
    }
    echo(
        f"prior: {len(vocab):,} relation paths, {len(rows):,} questions; held-out loss {best:.4f}, "
        f"top path is a target for {info['held_out_top1_is_target']:.3f} ({epoch} epochs)"
    )
    prior.info = info
    return prior
