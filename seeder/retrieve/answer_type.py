"""The type of node a question asks for, read from its interrogative; paths that end at another type lose mass.

A prior learnt from generated questions ("which person wrote the movie directed by ...") often stops a
path one hop early on a real one: "who starred movies for the director of X" names movies and a
director, and the nearest generated wording ends at the movies. Yet the question says what it asks for
in one or two words, and the graph's own type names say what each path ends at:

- an interrogative that names no noun (``who``, ``whom``, ``when``, ``where``) asks for the type whose
  name the encoder puts nearest to it, when that type is clearly the nearest (``MARGIN`` over the
  runner-up: "who" is nearest "person", "when" nearest "year"; "where" is nearest no type in particular);
- ``what`` or ``which`` followed by a word asks for the type that word names, when the encoder reads it
  as that type's name (cosine at least ``NOUN_COSINE``, the level of a plural or a synonym: "films" for
  "movie"), and as no other.

A path's end type is the commonest type of the nodes its last relation leads to
(``path_text.relation_tail_types``). The prior's probability of a path whose end type differs from the
asked one is multiplied by ``TYPE_FLOOR`` and renormalised: a demotion, not a filter, so a misread word
costs the right path its rank but not its place. Nothing here is learnt, so it reads real and generated
questions alike; the encoder's knowledge of English does the work that no phrasing template can.

A question's asked type travels as a one-hot block after its masked-question features (``one_hot``):
every place that hands a masked prior its reading of a question carries it unchanged, and the prior's
MLP reads it as one more input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.features.embed import l2_normalize
from seeder.retrieve.paths import path_digits, path_length

INTERROGATIVES = ("who", "whom", "when", "where")
"""Words that ask for a type without naming it."""
DETERMINERS = ("what", "which")
"""Words whose next word names the asked type."""
MARGIN = 0.05
"""How much nearer the asked word must be to its type's name than to any other type's."""
NOUN_COSINE = 0.6
"""How near the word after ``what`` / ``which`` must be to a type's name to name it."""
TYPE_FLOOR = 0.01
"""Share of its probability a path keeps when it ends at another type than the asked one."""

# The first interrogative, or the first determiner and its next word: pyarrow returns the first match.
_ASKED = r"\b(?P<bare>" + "|".join(INTERROGATIVES) + r")\b|\b(?:" + "|".join(DETERMINERS) + r")\s+(?P<noun>[a-z]+)"


def asked_words(texts: list[str]) -> list[str]:
    """Each question's asking word: its first interrogative, or the word after its first ``what`` /
    ``which``, whichever comes first; "" where it has neither."""
    if not texts:
        return []
    lower = pc.utf8_lower(pa.array(list(texts), type=pa.string()))
    found = pc.extract_regex(lower, pattern=_ASKED)
    bare = pc.fill_null(pc.struct_field(found, "bare"), "")
    noun = pc.fill_null(pc.struct_field(found, "noun"), "")
    return pc.if_else(pc.not_equal(bare, ""), bare, noun).to_pylist()


def asked_types(words: list[str], encode: Callable[[list[str]], np.ndarray], type_names: list[str]) -> np.ndarray:
    """[Q] index into ``type_names`` of the type each asking word names (-1: none, or undecided).
    ``encode``: texts -> the encoder's embeddings (one call for the distinct words and the names)."""
    out = np.full(len(words), -1, np.int64)
    distinct = sorted({w for w in words if w})
    if len(type_names) < 2 or not distinct:  # one type: nothing to tell apart
        return out
    embedded = l2_normalize(np.asarray(encode(distinct + list(type_names)), np.float32))
    similarity = embedded[: len(distinct)] @ embedded[len(distinct) :].T  # [words, types]
    order = np.argsort(-similarity, axis=1)
    best = np.take_along_axis(similarity, order[:, :2], axis=1)
    bare = np.isin(np.asarray(distinct, dtype=object), INTERROGATIVES)
    named = (best[:, 0] - best[:, 1] >= MARGIN) & (bare | (best[:, 0] >= NOUN_COSINE))
    decided = dict(zip(distinct, np.where(named, order[:, 0], -1).tolist()))
    out[:] = [decided.get(w, -1) for w in words]
    return out


def one_hot(asked: np.ndarray, num_types: int) -> np.ndarray:
    """[Q, num_types] float32: 1 at each question's asked type, a zero row where it has none."""
    out = np.zeros((len(asked), num_types), np.float32)
    known = asked >= 0
    out[np.flatnonzero(known), asked[known]] = 1.0
    return out


@dataclass
class AnswerTypes:
    """The node types questions may ask for, and the one each vocabulary path ends at."""

    FILE: ClassVar[str] = "answer_types.npz"
    """Where ``save`` writes it in a prior directory and ``load`` reads it."""

    names: list[str]
    path_types: np.ndarray  # int64 [V]: index into names of each vocabulary path's end type
    offset: int  # column of the prior's inputs where the one-hot asked type starts

    @classmethod
    def build(
        cls, names: list[str], tail_types: np.ndarray, vocab: np.ndarray, num_relation_ids: int, offset: int
    ) -> "AnswerTypes":
        """From the type names (``type_names``), each relation id's tail type and the prior's vocabulary."""
        digits = path_digits(vocab, num_relation_ids)
        last = digits[np.arange(len(vocab)), np.maximum(path_length(vocab, num_relation_ids) - 1, 0)]
        index = {name: i for i, name in enumerate(names)}
        path_types = np.array([index.get(t, -1) for t in np.asarray(tail_types, dtype=object)[last]], np.int64)
        return cls(list(names), path_types, int(offset))

    def reweigh(self, probs: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """The prior's [Q, V] path probabilities with the paths that end at another type than the one
        each question asks for (its one-hot block of ``inputs``) scaled by ``TYPE_FLOOR``, renormalised."""
        block = inputs[:, self.offset : self.offset + len(self.names)]
        asks = block.max(axis=1) > 0
        if not asks.any():
            return probs
        asked = block.argmax(axis=1)
        other = asks[:, None] & (self.path_types[None, :] != asked[:, None])
        out = probs * np.where(other, np.float32(TYPE_FLOOR), np.float32(1.0))
        return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-30)

    def save(self, directory: Path) -> None:
        np.savez(
            Path(directory) / self.FILE,
            names=np.asarray(self.names, dtype=str),
            path_types=self.path_types,
            offset=np.array(self.offset),
        )

    @classmethod
    def load(cls, directory: Path) -> "AnswerTypes | None":
        path = Path(directory) / cls.FILE
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            return cls([str(n) for n in z["names"]], z["path_types"].astype(np.int64), int(z["offset"]))


def type_names(tail_types: np.ndarray) -> list[str]:
    """The distinct types relations lead to, sorted: the types a question can ask for."""
    return sorted({str(t) for t in np.asarray(tail_types, dtype=object)})
