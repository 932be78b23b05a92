"""The wording of a question around its topic entity: hashed word features for the relation-path prior.

A sentence embedding of "what films did [Joel Zwick] direct" is dominated by the entity's name, and a
mean-pooled encoder hardly keeps the order of the words; yet the words next to the entity ("did X
direct", "directed by X") name the first hop, and the words further out name the later ones. SR
(Zhang et al., ACL 2022) and most KBQA relation predictors read the question with its topic entity
replaced by a placeholder for that reason. This module does that with plain counts:

1. the question is normalised like the entity linker's names (``seeds.normalise_texts``) and every
   occurrence of a seed's name becomes the placeholder token ``ENTITY``;
2. features are words, word pairs, and each word with its signed distance to the placeholder
   (``distance_bucket``: exact up to ``EXACT_DISTANCE``, then three coarser buckets per side), hashed into
   ``dim`` buckets with a sign bit (the hashing trick) and scaled to unit length. The distances must
   stay distinct far enough out to order three relation phrases ("the r3 of the r2 of the r1 of X"
   puts r1, r2 and r3 at 2, 5 and 8 words from X).

Everything but the masking (one ``str.replace`` per question) is vectorised over all tokens of all
questions at once. The features depend only on the question's text and its seeds' names, never on
answers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.retrieve.seeds import normalise_texts

WORDING_VERSION = 1
"""Bumped whenever the features change: a prior trained on other features must be retrained."""
ENTITY = "zzentityzz"
"""The placeholder a seed's name is replaced with (a token no normalised question contains)."""
EXACT_DISTANCE = 4
"""Words up to this many positions from the entity keep their exact distance; beyond, 5-7, 8-10 and
11+ share a bucket per side (exact distances further out split the same phrasing into too many
features: on MetaQA, exact distances up to 8 lost 2 points of the prior's held-out accuracy)."""

CATEGORIZE_FROM = 50_000
"""Word count from which the words are categorized before hashing (``pd.util.hash_array``): worth it
only for a corpus, whose words repeat (1.6x faster at 100,000 words; below, plain hashing wins;
benchmarks/RESULTS.md)."""


def distance_bucket(distance: np.ndarray) -> np.ndarray:
    """Signed distance to the entity -> its bucket, a signed integer of magnitude at most EXACT_DISTANCE + 3."""
    magnitude = np.abs(distance)
    far = EXACT_DISTANCE + 1 + np.minimum((magnitude - EXACT_DISTANCE - 1) // 3, 2)
    return np.sign(distance) * np.where(magnitude <= EXACT_DISTANCE, magnitude, far)


# Distinct salts keep the three feature families apart in the hashed space.
_PAIR, _DISTANCE, _NO_ENTITY = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)


def mask_entities(texts: list[str], seed_names: list[list[str]], replacements: list[list[str]] | None = None) -> list[str]:
    """Normalised ``texts`` with every occurrence of the (normalised) seed names replaced by ``ENTITY``, or by
    ``replacements`` (one per name, as ``seed_names``); longer names first, so a title is masked whole
    before any name inside it."""
    normal = normalise_texts(texts).to_pylist()
    flat = [name for names in seed_names for name in names]
    lookup = dict(zip(flat, normalise_texts(flat).to_pylist())) if flat else {}
    out = []
    for row, (text, names) in enumerate(zip(normal, seed_names)):
        padded = f" {text} "
        words = replacements[row] if replacements is not None else [ENTITY] * len(names)
        chosen = {lookup[n]: w for n, w in zip(names, words) if lookup.get(n)}
        for name in sorted(chosen, key=len, reverse=True):
            padded = padded.replace(f" {name} ", f" {chosen[name]} ")
        out.append(padded.strip())
    return out


MASK_WORD = "X"
"""What a seed's name becomes in ``masked_questions`` where the seed has no type."""


def masked_questions(texts: list[str], seed_names: list[list[str]], seed_types: list[list[str]]) -> list[str]:
    """The questions as the relation-path prior reads them with ``prior.question: masked``: normalised,
    each seed's name replaced by "the" and its node type ("what films did the person direct"), or by
    ``MASK_WORD`` where it has none. The name would dominate the sentence's embedding; the type says where
    the path starts ("the films whose writers also wrote the movie" is not "... wrote the person"), which
    the wording alone leaves open (on MetaQA, a prior fit on generated questions picks a right 1-hop path
    0.14 more often)."""
    words = [[f"the {t}" if t else MASK_WORD for t in types] for types in seed_types]
    return mask_entities(texts, seed_names, words)


def question_form(texts: list[str], seed_names: list[list[str]], dim: int) -> np.ndarray:
    """[Q, dim] float32 hashed wording features of each question with its seeds' names masked
    (rows of unit length; all zeros for an empty question). ``seed_names[i]``: the names of question
    i's seeds (may be empty)."""
    num_q = len(texts)
    out = np.zeros((num_q, dim), dtype=np.float32)
    if num_q == 0 or dim <= 0:
        return out
    masked = pa.array(mask_entities(list(texts), [list(n) for n in seed_names]), type=pa.string())
    tokens = pc.split_pattern(masked, " ")
    lengths = pc.list_value_length(tokens).to_numpy(zero_copy_only=False).astype(np.int64)
    words = pc.list_flatten(tokens).to_numpy(zero_copy_only=False)
    keep = words != ""  # an empty question splits into one empty token
    row = np.repeat(np.arange(num_q), lengths)[keep]
    words = words[keep]
    if len(words) == 0:
        return out
    position = np.arange(len(row)) - np.searchsorted(row, row)  # index of the word in its question
    # Categorizing first hashes each distinct word once, but costs about 0.1 ms of set-up: below
    # CATEGORIZE_FROM words (a question, a batch of a few thousand) hashing every word is faster. The
    # hashes are the same either way. pandas is imported here, not with the module: of all the library's
    # users only this function needs it, and it would add a sixth of a second to every preprocessing run.
    import pandas as pd

    word_hash = pd.util.hash_array(words.astype(object), categorize=len(words) >= CATEGORIZE_FROM).astype(np.uint64)
    # Distance of every word to its question's first placeholder (none: one bucket of its own).
    is_entity = words == ENTITY
    first_entity = np.full(num_q, -1, np.int64)
    hit_rows, hit_at = row[is_entity][::-1], position[is_entity][::-1]  # reversed: the first one wins
    first_entity[hit_rows] = hit_at
    anchor = first_entity[row]
    bucket = distance_bucket(position - anchor) + EXACT_DISTANCE + 4  # >= 1
    distance_hash = np.where(
        anchor >= 0,
        word_hash * _DISTANCE + bucket.astype(np.uint64),
        word_hash * _DISTANCE + _NO_ENTITY,
    )
    same_row_next = np.flatnonzero(row[1:] == row[:-1])
    pair_hash = word_hash[same_row_next] * _PAIR + word_hash[same_row_next + 1]
    hashes = np.concatenate([word_hash, pair_hash, distance_hash])
    rows = np.concatenate([row, row[same_row_next], row])
    # The hashing trick with a sign bit, so colliding features cancel on average instead of adding up.
    bucket = (hashes % np.uint64(dim)).astype(np.int64)
    sign = np.where((hashes >> np.uint64(63)) == 1, -1.0, 1.0).astype(np.float32)
    np.add.at(out, (rows, bucket), sign)
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norm, 1e-12)


def seed_names(names: pa.Array | pa.ChunkedArray, seeds: np.ndarray) -> list[list[str]]:
    """The node names of each row's seeds (``seeds`` [Q, k0], -1 padding skipped); ``names`` is the
    dataset's ``nodes.name`` column."""
    seeds = np.asarray(seeds, dtype=np.int64).reshape(len(seeds), -1)
    valid = seeds >= 0
    flat = pc.take(names, pa.array(seeds[valid])).to_pylist()
    bounds = np.cumsum(valid.sum(axis=1))[:-1]
    return [list(part) for part in np.split(np.asarray(flat, dtype=object), bounds)] if len(seeds) else []
