"""Seeding (paper, Section 3): the nodes each query's expansion starts from.

Two sources of seeds:

- dense: the top-k0 nodes by cosine to the query, computed exactly in blocks (queries x nodes) with a
  running top-k, so memory stays bounded at millions of nodes and ties break by node id; or, per
  ``seed.search``, from an approximate index (``seeder.retrieve.ann``) whose candidates are re-scored
  exactly (``dense_search`` chooses);
- entity linking (optional): node names mentioned verbatim in the query text, after case and
  punctuation normalisation, rarest mention first (by how many of the graph's queries mention it);
- given (optional): the node a query attribute names (MetaQA's bracketed topic entity, ``topic_id``),
  the setting in which KGQA systems such as NSM and ReaRev are measured.

``select_seeds`` combines them per ``seed.strategy``; ``seed_queries`` is the one entry point, shared
by preprocessing and by the retriever that seeds new questions.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.config import AUTO, ConfigError, SeedConfig, SeedStrategy, choices
from seeder.data.ragged import positions_within
from seeder.retrieve.ann import AnnIndex, check_ann_config, derived_nlist, search_block
from seeder.retrieve.topk import (  # noqa: F401 (dense_seeds and the screens are public here too)
    SCREENS,
    dense_seeds,
    merge_topk,
    pad_rows,
    resolve_screen,
    row_cosines,
    screen_error,
)
from seeder.system.io import DataError

STRATEGIES = ("dense", "entity", "dense+entity")  # what select_seeds combines
# Every seed.strategy: bm25 and hybrid come from the baselines, given reads a query attribute.
SEED_STRATEGIES = choices(SeedStrategy)
MAX_NGRAM = 12
"""Longest name, in tokens, that entity linking looks for (longer names are ignored)."""
STOP_WORDS = frozenset(
    """a about after all also an and any are as at be been before but by can could did do does
    for from had has have he her here him his how i if in into is it its me more most my no not of
    on one or our out over she so some than that the their them then there these they this those
    to up was we were what when where which while who whom whose why will with would you your""".split()
)
"""Names made only of these words (MetaQA has films called "What?", "Her", "Up") are not linked:
every question would match them."""


ANN_QUERIES_PER_LIST = 10
"""``seed.search: auto`` builds an index only for at least this many queries per index list: building
files every node under its nearest of ``nlist`` centroids, about as many products as the exact search
of ``nlist`` queries, so fewer queries than a few times ``nlist`` are seeded faster exactly (a new
question at the retriever, the derivation's sample)."""


def resolve_search(cfg: SeedConfig, num_nodes: int, num_queries: int | None = None) -> str:
    """``exact`` or ``ann``: what ``seed.search`` means for this graph and batch (see ``SeedConfig.search``).
    ``num_queries=None`` leaves the batch size out (a caller with a prebuilt index)."""
    if cfg.search != "exact":
        check_ann_config(cfg)
    if cfg.search != "auto" or num_nodes == 0:
        return "exact" if num_nodes == 0 else cfg.search
    if num_nodes < cfg.ann_min_nodes:
        return "exact"
    if num_queries is not None and num_queries < ANN_QUERIES_PER_LIST * derived_nlist(cfg, num_nodes):
        return "exact"
    return "ann"


def dense_search(
    query_features: np.ndarray,
    node_features: np.ndarray,
    cfg: SeedConfig,
    index=None,
    search: str | None = None,
    screen_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``cfg.k0`` dense seeds of every query, exact or from the ANN index per ``seed.search`` (or
    ``search`` when given, already resolved): the one place that chooses. ``index`` (an ``AnnIndex``)
    is reused when given, else built here over ``node_features`` when the index is chosen. The exact
    search screens ``screen_rows`` (the features' bfloat16 copy) when given. Same format as
    ``dense_seeds`` either way."""
    search = search or resolve_search(cfg, len(node_features), None if index is not None else len(query_features))
    if search == "exact":
        return dense_seeds(
            query_features, node_features, cfg.k0, cfg.block_nodes, cfg.block_queries, screen=cfg.screen, screen_rows=screen_rows
        )
    return search_block(index if index is not None else AnnIndex.build(node_features, cfg), query_features, cfg)


# ---------------------------------------------------------------------------------------------------
# Entity linking


_ASCII_SEPARATORS = re.compile(r"[^a-z0-9]+")
SMALL_BATCH = 64
"""Up to this many texts, all ASCII, are normalised in Python: Arrow compiles the Unicode regex on every
call (about 2 ms, most of a single question's seeding), which a large column amortises."""


def normalise_texts(texts: list[str] | pa.Array) -> pa.Array:
    """Lower case, every run of non-letters/digits turned into one space, trimmed.

    A few ASCII strings take a Python path with the same result: on ASCII, "letter or digit" is
    [a-z0-9] after lower-casing for Arrow's Unicode classes too."""
    if isinstance(texts, list) and len(texts) <= SMALL_BATCH and all(isinstance(t, str) and t.isascii() for t in texts):
        return pa.array([_ASCII_SEPARATORS.sub(" ", t.lower()).strip(" ") for t in texts], type=pa.string())
    arr = pa.array(texts, type=pa.string()) if not isinstance(texts, (pa.Array, pa.ChunkedArray)) else texts
    arr = pc.utf8_lower(arr.fill_null(""))
    arr = pc.replace_substring_regex(arr, pattern=r"[^\pL\pN]+", replacement=" ")
    return pc.utf8_trim_whitespace(arr)


def _split_words(texts: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]:
    """The words of normalised ``texts``, flat: (words, text row, position in its text, words from
    each to the end of its text). An empty text has none (it splits into one empty word)."""
    tokens = pc.split_pattern(texts, " ")
    counts = pc.list_value_length(tokens).to_numpy(zero_copy_only=False).astype(np.int64)
    words = pc.list_flatten(tokens)
    row = np.repeat(np.arange(len(texts)), counts)
    keep = pc.not_equal(words, "").to_numpy(zero_copy_only=False)
    counts = np.bincount(row[keep], minlength=len(texts))
    words, row = words.filter(pa.array(keep)), row[keep]
    position = positions_within(counts)
    return words, row, position, counts[row] - position


class EntityLinker:
    """Finds node names mentioned in plain query text (exact match after normalisation).

    Built once per graph: node names are normalised with Arrow kernels, names shorter than
    ``seed.entity_min_chars``, longer than ``MAX_NGRAM`` tokens or made only of ``STOP_WORDS`` are
    dropped, and a dict maps each distinct normalised name to a slice of node ids (several nodes may
    share a name; they come in id order).

    Which mention wins: the rarest first, counted as the number of the graph's own queries that
    mention the name (an IDF). Words of the question's phrasing that happen to be node names ("film",
    "director" are MetaQA tags) occur in thousands of questions; the entity a question is about occurs
    in a few. Ties go to the longer mention, then left to right. A longer name never counts more
    queries than a name inside it, so a title beats its own words. The counts use only query texts
    (no answers), so val and test questions may take part.

    Which of several nodes sharing a normalised name: those whose name occurs in the question with
    its own capitals and punctuation come first, then id order. Graphs keep a person and a tag of the
    same words apart by case alone (MetaQA's "Harry Connick Jr." and "harry connick jr."); lower-casing
    both sides had linked every tag question about a person to the person.
    """

    def __init__(self, kg, seed_config: SeedConfig):
        self.max_entities = seed_config.entity_max
        names = normalise_texts(kg.node_names)
        lengths = pc.utf8_length(names).to_numpy(zero_copy_only=False)
        tokens = pc.list_value_length(pc.split_pattern(names, " ")).to_numpy(zero_copy_only=False)
        only_stop_words = pc.match_substring_regex(
            names, pattern="^(" + "|".join(sorted(STOP_WORDS)) + r")( (" + "|".join(sorted(STOP_WORDS)) + "))*$"
        ).to_numpy(zero_copy_only=False)
        usable = (lengths >= max(seed_config.entity_min_chars, 1)) & (tokens <= MAX_NGRAM) & ~only_stop_words
        node_ids = np.flatnonzero(usable)
        encoded = pc.dictionary_encode(names.filter(pa.array(usable))).combine_chunks()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        self.node_ids = node_ids[order].astype(np.int64)
        self.names = kg.node_names  # original spelling, read only where a name is shared
        self.dictionary = encoded.dictionary  # the distinct usable names: a mention is its index here
        self.name_starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(self.dictionary)))])
        self.max_tokens = int(tokens[usable].max()) if usable.any() else 0
        self.prefixes = self._name_prefixes()
        # How many of the graph's own questions mention each name: one vectorised scan of them all.
        row, _, _, code = self._scan(normalise_texts(kg.table("queries", ["text"]).column("text")))[:4]
        distinct = np.unique(row * len(self.dictionary) + code)
        self.query_counts = np.bincount(distinct % max(len(self.dictionary), 1), minlength=len(self.dictionary))

    def _name_prefixes(self) -> list[tuple[pa.Array, np.ndarray]]:
        """Per word count n (item n - 1): the distinct n-word prefixes of the names, and the name code of
        each (-1: a prefix that is no name). A scan extends an n-gram only while it is such a prefix."""
        words, row, position, remaining = _split_words(self.dictionary)
        starts = np.flatnonzero(position == 0)
        prefixes, current = [], words.take(pa.array(starts))
        for n in range(1, self.max_tokens + 1):
            if n > 1:
                room = remaining[starts] >= n
                starts = starts[room]
                current = pc.binary_join_element_wise(current.filter(pa.array(room)), words.take(pa.array(starts + n - 1)), " ")
            distinct = pc.unique(current)
            code = np.full(len(distinct), -1, np.int64)
            whole = remaining[starts] == n
            code[pc.index_in(current.filter(pa.array(whole)), value_set=distinct).to_numpy()] = row[starts[whole]]
            prefixes.append((distinct, code))
        return prefixes

    def _scan(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, ...]:
        """(row, start, length, name code, words per text) of every word n-gram of the normalised
        ``texts`` that is a node name: all texts at once, by word count, each n-gram built from one a
        word shorter that begins a name (``_name_prefixes``), so that few are built past a word or two."""
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        words, text_row, position, remaining = _split_words(texts)
        num_words = np.bincount(text_row, minlength=len(texts))
        starts, current = np.arange(len(words)), words
        found: list[tuple[np.ndarray, ...]] = []
        for n, (prefixes, name_code) in enumerate(self.prefixes, 1):
            if n > 1:
                room = remaining[starts] >= n
                starts = starts[room]
                current = pc.binary_join_element_wise(current.filter(pa.array(room)), words.take(pa.array(starts + n - 1)), " ")
            at = pc.fill_null(pc.index_in(current, value_set=prefixes), -1).to_numpy()
            alive = at >= 0
            starts, current, code = starts[alive], current.filter(pa.array(alive)), name_code[at[alive]]
            name = code >= 0
            found.append((starts[name], np.full(int(name.sum()), n, np.int64), code[name]))
            if not len(starts):
                break
        first, length, code = (np.concatenate([f[i] for f in found]) if found else np.zeros(0, np.int64) for i in range(3))
        return text_row[first], position[first], length, code, num_words

    def mentioned_names(self, texts: list[str]) -> set[str]:
        """The names (normalised) that occur in any of ``texts`` as a word n-gram."""
        code = self._scan(normalise_texts(texts))[3]
        return set(self.dictionary.take(pa.array(np.unique(code))).to_pylist())

    def _verbatim_first(self, ids: np.ndarray, raw: str | None) -> list[int]:
        """Nodes sharing one normalised name, those spelled in ``raw`` exactly as named first."""
        if len(ids) < 2 or not raw:
            return ids.tolist()
        verbatim = [name in raw for name in self.names.take(pa.array(ids)).to_pylist()]
        return [int(i) for _, i in sorted(zip([not v for v in verbatim], ids.tolist()), key=lambda x: x[0])]

    def link(self, texts: list[str]) -> list[np.ndarray]:
        """Per text, the node ids of the names it mentions, rarest mention first (then longest, then
        left to right); mentions never overlap; at most ``seed.entity_max`` ids (empty when none)."""
        raw_texts = texts.to_pylist() if isinstance(texts, (pa.Array, pa.ChunkedArray)) else list(texts)
        row, start, length, code, num_words = self._scan(normalise_texts(texts))
        order = np.lexsort((start, -length, self.query_counts[code], row))
        bounds = np.searchsorted(row[order], np.arange(len(raw_texts) + 1))
        start, length, code = (a[order].tolist() for a in (start, length, code))
        out = []
        for i, raw in enumerate(raw_texts):  # the choice among one text's mentions is sequential
            used = np.zeros(num_words[i], dtype=bool)
            found: list[int] = []
            for k in range(bounds[i], bounds[i + 1]):
                if len(found) >= self.max_entities:
                    break
                s, n = start[k], length[k]
                if used[s : s + n].any():
                    continue
                used[s : s + n] = True
                lo, hi = self.name_starts[code[k]], self.name_starts[code[k] + 1]
                found.extend(self._verbatim_first(self.node_ids[lo:hi], raw))
            out.append(np.asarray(list(dict.fromkeys(found)), dtype=np.int64)[: self.max_entities])
        return out


def given_seeds(kg, query_ids: np.ndarray, attribute: str) -> list[np.ndarray]:
    """``seed.strategy: given``: the node id each query names in ``attribute`` (null: none)."""
    if attribute not in kg.queries.column_names:
        raise ConfigError(
            f"seed.strategy=given reads the query attribute {attribute!r}, which {kg.path}/queries.parquet "
            f"lacks (columns: {', '.join(kg.queries.column_names)}); set seed.given_attribute or another strategy"
        )
    rows = kg.query_rows(query_ids)
    column = kg.queries.column(attribute).combine_chunks().take(pa.array(rows))
    if not pa.types.is_integer(column.type):
        raise ConfigError(f"seed.given_attribute={attribute!r} has type {column.type}; it must hold node ids (integers)")
    ids = column.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False))
    ids = np.where(valid, np.nan_to_num(ids.astype(np.float64), nan=-1), -1).astype(np.int64)
    bad = valid & ((ids < 0) | (ids >= kg.num_nodes))
    if bad.any():
        raise DataError(
            f"{kg.path}: query {int(query_ids[np.flatnonzero(bad)[0]])} names node "
            f"{int(ids[np.flatnonzero(bad)[0]])} in {attribute!r}, which is not a node of the graph"
        )
    return [np.array([i], np.int64) if i >= 0 else np.zeros(0, np.int64) for i in ids.tolist()]


# ---------------------------------------------------------------------------------------------------
# Combining


def select_seeds(
    seed_config: SeedConfig,
    dense_ids: np.ndarray,
    dense_scores: np.ndarray,
    linked: list[np.ndarray] | None,
    query_features: np.ndarray | None = None,
    node_features: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeds per ``seed.strategy``: (ids int64 [Q, k0] padded -1, scores float32 padded -inf).

    ``dense`` keeps the dense seeds; ``entity`` keeps only entity-linked nodes (a query with no
    mention gets no seeds); ``dense+entity`` puts entity-linked nodes first, then dense seeds up to
    k0, without duplicates. An entity-linked seed's score is its cosine to the query when
    ``query_features`` and ``node_features`` are given, else NaN (K-HOP-WITH-FILTERING recomputes
    seed cosines itself, so only the stored score is affected).
    """
    strategy = seed_config.strategy
    if strategy not in STRATEGIES:
        raise ConfigError(f"seed.strategy={strategy!r}; use one of {', '.join(STRATEGIES)}")
    k0 = seed_config.k0
    dense_ids = np.asarray(dense_ids, dtype=np.int64)
    num_queries = len(dense_ids)
    if strategy != "dense" and linked is None:
        raise ConfigError(f"seed.strategy={strategy!r} needs entity-linked seeds; build an EntityLinker")
    # Flat candidates (query, priority, id, score): linked ones first, then the dense row.
    parts_q, parts_p, parts_id, parts_s = [], [], [], []
    if strategy != "dense":
        lengths = np.asarray([len(x) for x in linked], dtype=np.int64)
        if len(lengths) != num_queries:
            raise ValueError(f"{len(lengths)} linked-seed lists for {num_queries} queries")
        flat = np.concatenate(linked).astype(np.int64) if lengths.sum() else np.zeros(0, np.int64)
        q = np.repeat(np.arange(num_queries), lengths)
        within = positions_within(lengths)
        if query_features is not None and node_features is not None:
            scores = row_cosines(query_features, node_features, q, flat)
        else:
            scores = np.full(len(flat), np.nan, dtype=np.float32)
        parts_q.append(q), parts_p.append(within), parts_id.append(flat), parts_s.append(scores)
    if strategy != "entity":
        valid = dense_ids >= 0
        q, col = np.nonzero(valid)
        parts_q.append(q), parts_p.append(col + 10**6), parts_id.append(dense_ids[valid])
        parts_s.append(np.asarray(dense_scores, dtype=np.float32)[valid])
    q, prio, ids, scores = (np.concatenate(p) for p in (parts_q, parts_p, parts_id, parts_s))
    # Drop repeats of (query, id), keeping the highest-priority occurrence.
    order = np.lexsort((prio, ids, q))
    q, prio, ids, scores = q[order], prio[order], ids[order], scores[order]
    first = np.ones(len(q), dtype=bool)
    first[1:] = (q[1:] != q[:-1]) | (ids[1:] != ids[:-1])
    q, prio, ids, scores = q[first], prio[first], ids[first], scores[first]
    order = np.lexsort((prio, q))
    q, ids, scores = q[order], ids[order], scores[order]
    starts = np.searchsorted(q, np.arange(num_queries))
    rank = np.arange(len(q)) - starts[q]
    keep = rank < k0
    out_ids = np.full((num_queries, k0), -1, dtype=np.int64)
    out_scores = np.full((num_queries, k0), -np.inf, dtype=np.float32)
    out_ids[q[keep], rank[keep]] = ids[keep]
    out_scores[q[keep], rank[keep]] = scores[keep]
    return out_ids, out_scores


def distinct_per_row(rows: list[np.ndarray], num_rows: int) -> np.ndarray:
    """How many distinct ids each row of a ragged list holds (vectorised over all rows)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    if lengths.sum() == 0:
        return np.zeros(num_rows, dtype=np.int64)
    flat = np.concatenate(rows).astype(np.int64)
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    width = int(flat.max()) + 1  # one int64 key per (row, id): a 1-D unique, not a row-wise one
    return np.bincount(np.unique(owner * width + flat) // width, minlength=num_rows)


def seed_queries(
    kg,
    config,
    query_features: np.ndarray,
    node_features: np.ndarray,
    texts: list[str] | None = None,
    query_ids: np.ndarray | None = None,
    linker: "EntityLinker | None" = None,
    given: list[np.ndarray] | None = None,
    index=None,
    search: str | None = None,
    dense: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The seeds of some queries per ``config.seed.strategy``, for preprocessing and for new questions
    alike: (ids int64 [Q, k0] padded -1, scores float32 padded -inf).

    ``texts`` are needed by every strategy but ``dense`` and ``given``; ``given`` reads the dataset's
    ``seed.given_attribute`` of ``query_ids`` unless the topic nodes are passed (``given``: one array
    per query; a new question without one is seeded densely). Pass a prebuilt ``linker`` to reuse its
    name index across calls. Dense seeds come from ``dense_search``: ``search`` (``exact`` or ``ann``,
    resolved by the caller) overrides ``seed.search``, and a prebuilt ANN ``index`` is reused. ``dense``
    replaces that search: it takes the features of the queries that need dense seeds and returns their
    (ids, scores) as ``dense_seeds`` does (preprocessing spreads it over Ray tasks)."""
    cfg = config.seed
    if cfg.strategy == AUTO:
        raise ConfigError(
            "seed.strategy=auto is resolved by preprocessing (seeder.preprocessing.derive); seed with the resolved config"
        )
    if cfg.strategy not in ("dense", "given") and texts is None:
        raise ConfigError(f"seed.strategy={cfg.strategy!r} needs the query texts")
    combine, linked = cfg.strategy, None
    if cfg.strategy == "bm25":
        from seeder.retrieve.lexical import bm25_seeds  # bm25s only for the strategies that use it

        # BM25 seeds first; dense seeds fill queries that share no term with any node text.
        bm25_ids, _ = bm25_seeds(kg, texts, cfg.k0, config.baselines)
        linked = [row[row >= 0] for row in bm25_ids]
        combine = "dense+entity"
    elif cfg.strategy in ("entity", "dense+entity"):
        linked = (linker or EntityLinker(kg, cfg)).link(texts)
    elif cfg.strategy == "given":
        linked = given if given is not None else given_seeds(kg, query_ids, cfg.given_attribute)
        combine = "dense+entity"  # the given node first; dense seeds fill queries without one
    if cfg.strategy == "hybrid":
        from seeder.retrieve.lexical import hybrid_seeds  # bm25s only for the strategies that use it

        # Reciprocal rank fusion of BM25 and the exact dense ranking replaces the dense ranking.
        pool = max(config.baselines.hybrid.pool, 1)
        dense_pool, _ = dense_seeds(query_features, node_features, pool)
        dense_ids, dense_scores = hybrid_seeds(kg, texts, dense_pool, cfg.k0, config.baselines)
        combine = "dense"
    else:
        # Dense seeds only where they can enter: a query with k0 distinct linked seeds keeps those
        # (``select_seeds`` puts linked seeds first), and ``entity`` never uses dense ones. A linked
        # MetaQA question skips a scan of every node (2 ms of its seeding and expansion).
        if combine == "entity":
            need = np.zeros(len(query_features), dtype=bool)
        elif linked is None:
            need = np.ones(len(query_features), dtype=bool)
        else:
            need = distinct_per_row(linked, len(query_features)) < cfg.k0
        dense_ids = np.full((len(query_features), cfg.k0), -1, dtype=np.int64)
        dense_scores = np.full((len(query_features), cfg.k0), -np.inf, dtype=np.float32)
        if need.any():
            dense = dense or (lambda features: dense_search(features, node_features, cfg, index=index, search=search))
            dense_ids[need], dense_scores[need] = dense(np.asarray(query_features)[need])
    seeds, scores = select_seeds(
        dataclasses.replace(cfg, strategy=combine), dense_ids, dense_scores, linked, query_features, node_features
    )
    return np.asarray(seeds, dtype=np.int64), np.asarray(scores, dtype=np.float32)
