"""Relation paths written as questions, matched against the question's own wording.

The relation-path prior (``seeder.retrieve.prior``) reads a mean-pooled embedding of the masked
question through one softmax per hop. That reading blurs how many relations a question names: "which
person wrote the films directed by the director of the movie" comes out as the films (the right first two
hops, then "stop"). Yet each vocabulary path can itself be written as a question from the graph's own
texts, answer type first and each relation's inverse text back to the seed:

    which person | wrote the movie | directed by the person | directed the movie

and the encoder that embeds the questions compares the two sentences as wholes: the one that names the
same relations and asks for the same type is the closest. The prior's path probabilities are multiplied
by ``exp(weight * cosine)`` (a log-linear product of two experts) and renormalised. The weight is not a
guess: ``choose_weight`` picks it from a grid on the prior's own held-out training questions, so a prior
whose questions the MLP already reads well keeps a small one (0 turns the match off).

The cosine is taken between the raw encoder embeddings. What the prior keeps of a question is its
PCA'd, re-normalised embedding; ``PathText.cosine`` undoes the projection (the raw embedding is unit
length and lies, up to the variance the PCA dropped, in the PCA's affine subspace: one quadratic gives
its offset along it), so nothing beyond the prior's inputs is needed at query time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from seeder.data.subgraphs import sorted_lookup
from seeder.retrieve.paths import path_digits

WEIGHTS = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0)
"""The match weights ``choose_weight`` tries: a cosine difference of 0.05 then moves a path's odds by
up to e^4."""
PATH_TEXT_MAX = 50_000
"""Vocabularies of more paths than this are not written out (each is one encoding)."""
UNTYPED = "node"
"""The type word of a node without a type (as ``seeder questions`` writes it)."""


def relation_tail_types(
    neighbors: np.ndarray, edge_relations: np.ndarray, node_types: np.ndarray, num_relation_ids: int
) -> np.ndarray:
    """[2R] object array: the commonest type of the nodes each relation id leads to (over the CSR's
    edges, both directions). A relation id no edge has gets ``UNTYPED``."""
    types = np.where(np.asarray(node_types, dtype=object) == None, UNTYPED, node_types)  # noqa: E711
    types = np.where(types == "", UNTYPED, types).astype(str)
    names, code = np.unique(types, return_inverse=True)
    counts = np.zeros((num_relation_ids, len(names)), np.int64)
    np.add.at(counts, (np.asarray(edge_relations, np.int64), code[np.asarray(neighbors, np.int64)]), 1)
    return np.where(counts.sum(axis=1) > 0, names[counts.argmax(axis=1)], UNTYPED).astype(object)


def render_paths(codes: np.ndarray, num_relation_ids: int, relation_texts: list[str], tail_types: np.ndarray) -> list[str]:
    """Each path code as the question it asks: "which {type} {inverse text of r_l} the {type}
    {inverse text of r_(l-1)} ... the {start type}", the way ``seeder questions`` names the nodes on a
    path (its ``typed_back`` phrasing). The start type is the type the inverse of r_1 leads to."""
    texts = np.asarray(relation_texts, dtype=object)
    half = num_relation_ids // 2
    digits = path_digits(codes, num_relation_ids)
    length = (digits >= 0).sum(axis=1)
    first = np.maximum(digits[:, 0], 0) if digits.shape[1] else np.zeros(len(codes), np.int64)
    phrase = "the " + tail_types[(first + half) % num_relation_ids]
    out = np.empty(len(codes), dtype=object)
    for hop in range(digits.shape[1]):
        rel = np.maximum(digits[:, hop], 0)
        named = tail_types[rel] + " " + texts[(rel + half) % num_relation_ids] + " " + phrase
        last = length == hop + 1
        out[last] = "which " + named[last]
        phrase = np.where(length > hop + 1, "the " + named, phrase)
    return out.tolist()


@dataclass
class PathText:
    """The rendered paths' embeddings in the basis of the prior's question features, and the match weight."""

    FILE: ClassVar[str] = "path_text.npz"
    """Where ``save`` writes it in a prior directory and ``load`` reads it."""

    paths: np.ndarray  # float32 [V, d]: each vocabulary path's raw unit embedding, projected on the basis
    offset: np.ndarray  # float32 [V]: its dot product with the PCA's mean
    mean: np.ndarray  # float32 [d]: the PCA's mean in the basis (zeros without a PCA)
    mean_sq: float  # squared norm of the PCA's mean (0 without one)
    weight: float = 0.0

    @classmethod
    def build(cls, embedded: np.ndarray, pca=None, weight: float = 0.0) -> "PathText":
        """From the rendered paths' raw, unit-length encoder embeddings [V, D] and the features stage's
        PCA (None when the question features are the raw embeddings)."""
        x = np.asarray(embedded, np.float64)
        if pca is None:
            return cls(x.astype(np.float32), np.zeros(len(x), np.float32), np.zeros(x.shape[1], np.float32), 0.0, weight)
        mean, basis = np.asarray(pca.mean, np.float64), np.asarray(pca.components, np.float64)
        return cls(
            (x @ basis.T).astype(np.float32),
            (x @ mean).astype(np.float32),
            (basis @ mean).astype(np.float32),
            float(mean @ mean),
            weight,
        )

    @property
    def dim(self) -> int:
        return int(self.paths.shape[1])

    def cosine(self, features: np.ndarray) -> np.ndarray:
        """[Q, V] cosine between each question's raw embedding and each path's, from the question's
        unit-length PCA'd features [Q, d]: the raw embedding is mean + s * (features @ components) with
        s > 0 chosen so that its length is 1."""
        v = np.asarray(features, np.float64)
        along = v @ self.mean
        scale = -along + np.sqrt(np.maximum(along**2 - self.mean_sq + 1.0, 0.0))
        return (self.offset[None, :] + scale[:, None] * (v @ self.paths.T.astype(np.float64))).astype(np.float32)

    def reweigh(self, probs: np.ndarray, features: np.ndarray, weight: float | None = None) -> np.ndarray:
        """The prior's [Q, V] path probabilities times exp(weight * cosine), renormalised; paths without
        mass keep none."""
        weight = self.weight if weight is None else weight
        if weight == 0:
            return probs
        logit = weight * self.cosine(features)
        out = probs * np.exp(logit - logit.max(axis=1, keepdims=True))
        return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-30)

    def save(self, directory: Path) -> None:
        np.savez(
            Path(directory) / self.FILE,
            paths=self.paths,
            offset=self.offset,
            mean=self.mean,
            scalars=np.array([self.mean_sq, self.weight]),
        )

    @classmethod
    def load(cls, directory: Path) -> "PathText | None":
        path = Path(directory) / cls.FILE
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            mean_sq, weight = (float(v) for v in z["scalars"])
            return cls(paths=z["paths"], offset=z["offset"], mean=z["mean"], mean_sq=mean_sq, weight=weight)


def choose_weight(
    probs: np.ndarray, text: PathText, features: np.ndarray, target_keys: np.ndarray, weights=WEIGHTS
) -> tuple[float, dict[float, float]]:
    """The match weight for the held-out questions' ``probs`` [H, V] and ``features`` [H, d]
    (``target_keys``: the sorted ``row * V + slot`` of their target paths), and each weight's share of
    questions whose reweighed top path is a target.

    The largest weight within one standard error of the best share (the one-standard-error rule of
    model selection): the held-out questions are worded by the same templates as the ones the MLP
    fitted, so they understate how far real wording strays from them, and where the two are as good
    the fixed text match, which learnt nothing from the templates, is the safer reader."""
    num_paths = probs.shape[1]
    cosine = text.cosine(features)
    shares = {}
    for weight in weights:
        # Paths the prior gives no mass (their first relation leaves the seeds) stay out, as in ``reweigh``.
        score = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)) + weight * cosine, -np.inf)
        top = score.argmax(axis=1)
        shares[float(weight)] = (
            float(sorted_lookup(target_keys, np.arange(len(top)) * num_paths + top)[0].mean()) if len(top) else 0.0
        )
    best = max(shares.values())
    error = np.sqrt(best * (1 - best) / max(len(probs), 1))
    return max(w for w, s in shares.items() if s >= best - error), shares
