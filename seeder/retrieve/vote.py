"""Labelled questions vote for their relation paths (``prior.vote: labelled``).

A relation-path prior fitted mostly on generated questions (``seeder questions``) learns the templates'
wording; a handful of real questions say how users ask, but among tens of thousands of generated ones
they move the fit little. Their paths are carried over by a kernel vote instead, as a nearest-neighbour
classifier would (the few-shot baseline of KBQA relation predictors): each labelled training question j
votes for its target paths with weight

    k_j(q) = exp((cos(x_q, x_j) - 1) / temperature),

its targets' shares split by their F1 weight, and the prior's path probabilities are multiplied by
``floor + vote``. A question worded like a labelled one (cosine near 1) takes its paths; one far from
every labelled question gets votes near 0 on every path, and the prior's ranking stands.

``x`` is what the prior reads of a question (``prior.question``: the masked question's embedding by
default, so that "who directed [the movie]" is close to every such question whatever the movie).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from seeder.data.subgraphs import sorted_lookup
from seeder.features.embed import l2_normalize

NEAREST = 64
"""Only the nearest labelled questions of each new one vote: beyond them a kernel of the default width
has decayed to nothing that changes a ranking."""


@dataclass
class LabelledVote:
    features: np.ndarray  # float32 [N, d], L2-normalised readings of the labelled questions
    ptr: np.ndarray  # int64 [N + 1]: their target paths, CSR
    slot: np.ndarray  # int64 [E]: vocabulary slot of each target path
    share: np.ndarray  # float32 [E]: its share of its question's vote (sums to 1 per question)
    temperature: float
    floor: float

    FILE: ClassVar[str] = "vote.npz"
    """Where ``save`` writes it in a prior directory and ``load`` reads it."""

    @classmethod
    def build(
        cls,
        features: np.ndarray,
        question: np.ndarray,
        code: np.ndarray,
        weight: np.ndarray,
        vocab: np.ndarray,
        temperature: float,
        floor: float,
    ) -> "LabelledVote | None":
        """From target rows (question row, path code, weight), sorted by question row, of the labelled
        questions whose readings are ``features`` (indexed by that row). Paths outside the prior's
        vocabulary cannot be scored and are dropped; None when no labelled question keeps a target."""
        known, slot = sorted_lookup(np.asarray(vocab, np.int64), np.asarray(code, np.int64))
        question, slot, weight = np.asarray(question)[known], slot[known], np.asarray(weight, np.float64)[known]
        rows, start = np.unique(question, return_index=True)
        if len(rows) == 0:
            return None
        total = np.add.reduceat(weight, start)
        counts = np.diff(np.append(start, len(question)))
        share = weight / np.repeat(total, counts)
        return cls(
            features=l2_normalize(np.asarray(features, np.float32)[rows]),
            ptr=np.append(0, np.cumsum(counts)).astype(np.int64),
            slot=slot.astype(np.int64),
            share=share.astype(np.float32),
            temperature=float(temperature),
            floor=float(floor),
        )

    @property
    def size(self) -> int:
        return len(self.features)

    def votes(self, readings: np.ndarray, num_paths: int) -> np.ndarray:
        """[Q, num_paths] each path's vote for each question (its reading in the rows of ``readings``)."""
        sim = l2_normalize(np.asarray(readings, np.float32)) @ self.features.T
        k = min(NEAREST, self.size)
        nearest = np.argpartition(-sim, k - 1, axis=1)[:, :k] if k < self.size else np.broadcast_to(np.arange(k), sim.shape)
        kernel = np.exp((np.take_along_axis(sim, nearest, axis=1) - 1.0) / self.temperature)
        # Every (question, neighbour) pair, expanded to the neighbour's target paths.
        q = np.repeat(np.arange(len(sim)), k)
        j = nearest.reshape(-1)
        counts = self.ptr[j + 1] - self.ptr[j]
        entry = np.repeat(self.ptr[j] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        out = np.zeros((len(sim), num_paths), np.float32)
        np.add.at(out, (np.repeat(q, counts), self.slot[entry]), np.repeat(kernel.reshape(-1), counts) * self.share[entry])
        return out

    def reweigh(self, probs: np.ndarray, readings: np.ndarray) -> np.ndarray:
        """The prior's [Q, V] path probabilities times (floor + vote), renormalised; paths the prior gives
        no mass (their first relation leaves the seeds) keep none."""
        out = probs * (self.floor + self.votes(readings, probs.shape[1]))
        return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-30)

    def save(self, directory: Path) -> None:
        np.savez(
            Path(directory) / self.FILE,
            features=self.features,
            ptr=self.ptr,
            slot=self.slot,
            share=self.share,
            kernel=np.array([self.temperature, self.floor]),
        )

    @classmethod
    def load(cls, directory: Path) -> "LabelledVote | None":
        path = Path(directory) / cls.FILE
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            temperature, floor = (float(v) for v in z["kernel"])
            return cls(
                features=z["features"], ptr=z["ptr"], slot=z["slot"], share=z["share"], temperature=temperature, floor=floor
            )
