"""Which relation a question names first and which last: the words next to its seed and to its asking word.

The path-text match (``seeder.retrieve.path_text``) compares whole sentences, and a mean-pooled
sentence embedding hardly keeps word order: "who directed films that share actors with the movie" and
the path starred -> starred in -> directed, or directed -> starred in -> starred, read alike. English
keeps the order where it matters, though: the relation next to the seed's name is the path's first
("share actors with [the movie]"), and the one next to the asking word its last ("who directed").

So each question gives two short windows, the ``WINDOW`` words either side of its seed (the masked
placeholder "the movie") and either side of its asking word (``answer_type.asked_words``), and each
relation id one short sentence, its one-hop path written as a question ("which person directed the
movie", ``path_text.render_paths``). A path's probability is multiplied by
exp(w_seed x cosine(seed window, its first relation) + w_ask x cosine(asking window, its last relation))
and renormalised. The two weights are chosen like the path-text weight, on the prior's held-out training
questions (``choose_weights``). Nothing is learnt from the templates' wording.

The windows' embeddings travel in the prior's reading of a question, after the masked question's
features and the asked type (``offset``), and the prior's MLP does not read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.data.subgraphs import sorted_lookup
from seeder.retrieve.answer_type import DETERMINERS, INTERROGATIVES
from seeder.retrieve.paths import path_digits, path_length
from seeder.retrieve.wording import ENTITY, mask_entities

WINDOW = 3
"""Words kept on each side of the seed's placeholder and of the asking word."""
WEIGHTS = (0.0, 5.0, 10.0, 20.0)
"""Each weight ``choose_weights`` tries, for either window (all pairs)."""


def question_windows(texts: list[str], seed_names: list[list[str]], seed_types: list[list[str]]) -> tuple[list[str], list[str]]:
    """Each question's seed window ("share actors with the movie") and asking window ("who directed films
    that"), normalised like ``wording.masked_questions``; "" where it names no seed or asks by no word."""
    num_q = len(texts)
    if num_q == 0:
        return [], []
    tokens = pc.split_pattern(pa.array(mask_entities(list(texts), [list(n) for n in seed_names]), type=pa.string()), " ")
    lengths = pc.list_value_length(tokens).to_numpy(zero_copy_only=False).astype(np.int64)
    words = np.asarray(pc.list_flatten(tokens).to_numpy(zero_copy_only=False), dtype=object)
    row = np.repeat(np.arange(num_q), lengths)
    position = np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths)

    def window(marks: np.ndarray) -> list[str]:
        anchor = np.full(num_q, -1, np.int64)
        anchor[row[marks][::-1]] = position[marks][::-1]  # reversed: the first mark of a row wins
        keep = (anchor[row] >= 0) & (np.abs(position - anchor[row]) <= WINDOW)
        counts = np.bincount(row[keep], minlength=num_q)
        lists = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32()), pa.array(words[keep], pa.string())
        )
        return pc.binary_join(lists, " ").to_pylist()

    seed_side = window(words == ENTITY)
    asking = window(np.isin(words, INTERROGATIVES + DETERMINERS))
    # The seed's placeholder reads as its type, as in the masked question ("the movie").
    phrase = [f"the {types[0]}" if types and types[0] else "X" for types in seed_types]
    return [w.replace(ENTITY, p) for w, p in zip(seed_side, phrase)], [w.replace(ENTITY, p) for w, p in zip(asking, phrase)]


@dataclass
class LocalMatch:
    """Each relation id's one-hop sentence in the question features' space, the vocabulary paths' first
    and last relation ids, where the windows sit in the prior's inputs, and the two weights."""

    FILE: ClassVar[str] = "local_match.npz"
    """Where ``save`` writes it in a prior directory and ``load`` reads it."""

    relations: np.ndarray  # float32 [2R, d]
    first: np.ndarray  # int64 [V]
    last: np.ndarray  # int64 [V]
    offset: int  # inputs column where the seed window's d features start (the asking window's follow)
    seed_weight: float = 0.0
    ask_weight: float = 0.0

    @classmethod
    def build(cls, relations: np.ndarray, vocab: np.ndarray, num_relation_ids: int, offset: int) -> "LocalMatch":
        digits = path_digits(vocab, num_relation_ids)
        last = digits[np.arange(len(vocab)), np.maximum(path_length(vocab, num_relation_ids) - 1, 0)]
        return cls(np.asarray(relations, np.float32), np.maximum(digits[:, 0], 0), np.maximum(last, 0), int(offset))

    @property
    def dim(self) -> int:
        return int(self.relations.shape[1])

    @property
    def columns(self) -> slice:
        """The inputs' columns that hold the two windows (the MLP skips them)."""
        return slice(self.offset, self.offset + 2 * self.dim)

    def cosines(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[Q, V] cosine of each question's seed window to each path's first relation, and of its asking
        window to the path's last (0 where a window is empty: its features are zeros)."""
        seed = inputs[:, self.offset : self.offset + self.dim] @ self.relations.T
        ask = inputs[:, self.offset + self.dim : self.offset + 2 * self.dim] @ self.relations.T
        return seed[:, self.first], ask[:, self.last]

    def reweigh(self, probs: np.ndarray, inputs: np.ndarray, weights: tuple[float, float] | None = None) -> np.ndarray:
        seed_weight, ask_weight = (self.seed_weight, self.ask_weight) if weights is None else weights
        if seed_weight == 0 and ask_weight == 0:
            return probs
        seed, ask = self.cosines(inputs)
        logit = seed_weight * seed + ask_weight * ask
        out = probs * np.exp(logit - logit.max(axis=1, keepdims=True))
        return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-30)

    def save(self, directory: Path) -> None:
        np.savez(
            Path(directory) / self.FILE,
            relations=self.relations,
            first=self.first,
            last=self.last,
            scalars=np.array([self.offset, self.seed_weight, self.ask_weight]),
        )

    @classmethod
    def load(cls, directory: Path) -> "LocalMatch | None":
        path = Path(directory) / cls.FILE
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            offset, seed_weight, ask_weight = z["scalars"].tolist()
            return cls(z["relations"], z["first"], z["last"], int(offset), seed_weight, ask_weight)


def choose_weights(
    probs: np.ndarray, match: LocalMatch, inputs: np.ndarray, target_keys: np.ndarray, weights=WEIGHTS
) -> tuple[tuple[float, float], dict[tuple[float, float], float]]:
    """The (seed, ask) weights for held-out questions' ``probs`` [H, V] and ``inputs``
    (``target_keys``: sorted ``row * V + slot`` of their target paths), and each pair's share of questions
    whose reweighed top path is a target: of the pairs within one standard error of the best share, the
    one of the largest total weight (``path_text.choose_weight``'s rule, for the same reason)."""
    num_paths = probs.shape[1]
    seed, ask = match.cosines(inputs)
    base = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), -np.inf)
    shares = {}
    for seed_weight in weights:
        for ask_weight in weights:
            top = (base + seed_weight * seed + ask_weight * ask).argmax(axis=1)
            hit = sorted_lookup(target_keys, np.arange(len(top)) * num_paths + top)[0]
            shares[(float(seed_weight), float(ask_weight))] = float(hit.mean()) if len(top) else 0.0
    best = max(shares.values())
    error = np.sqrt(best * (1 - best) / max(len(probs), 1))
    within = [pair for pair, share in shares.items() if share >= best - error]
    return max(within, key=lambda pair: (sum(pair), pair[1])), shares
