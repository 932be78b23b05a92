"""The relation-path prior: which relation path from the seed a question asks for, learnt from the
golden paths of the training questions (seeder.retrieve.paths).

The paper's K-HOP-WITH-FILTERING scores an edge's relation by its cosine to the question, which does
not know which relation the question asks for at which hop ("the actors of the films written by the
writer of X" must follow ``written_by``, then ``written_by`` backwards, then ``starred_actors``). SR
(Zhang et al., ACL 2022) trains a relation-path retriever from gold answers instead; this is that
idea in its smallest form:

- **Targets.** A question's target distribution puts weight F1(p) on each relation path p whose end
  nodes' F1 against the answers is at least ``prior.keep_ratio`` of its best path's F1.
- **Model.** A two-layer MLP from the PCA'd query embedding to a softmax over a vocabulary of relation
  paths (the most frequent targets), trained with the soft-target cross-entropy; a hashed slice of the
  training questions is held out for early stopping.
- **Use.** The vocabulary's paths and all their prefixes form a trie. For a question, the *path term*
  of trie node t is the probability mass of the vocabulary paths that start with t, plus the mass of the
  path that ends at t. In K-HOP-WITH-FILTERING (``expand.relation_score: learned``) a candidate reached
  from a node on prefix t by relation r takes the path term of t + r: it inherits its path from its
  parent, so nodes on the predicted path outrank a hub's neighbourhood, and nodes where a likely path
  ends score highest.

Weights are plain arrays (``prior.npz``) beside a JSON description; inference is numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seeder.config import PriorConfig
from seeder.io import DataError
from seeder.retrieve.paths import ROOT, path_length


def path_targets(query: np.ndarray, code: np.ndarray, hits: np.ndarray, reached: np.ndarray, answers: np.ndarray,
                 keep_ratio: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per golden-path row: keep it as a target of its query? Returns (rows kept, their weight, F1).

    ``answers`` is the query's answer count, per row. Rows must be grouped by query.
    """
    precision = hits / np.maximum(reached, 1)
    recall = hits / np.maximum(answers, 1)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    if len(query) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), f1
    starts = np.flatnonzero(np.r_[True, query[1:] != query[:-1]])
    best = np.maximum.reduceat(f1, starts)
    best_per_row = np.repeat(best, np.diff(np.append(starts, len(query))))
    kept = np.flatnonzero(f1 >= keep_ratio * best_per_row - 1e-12)
    return kept, f1[kept].astype(np.float32), f1


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

    def path_terms(self, probs: np.ndarray) -> np.ndarray:
        """[Q, V] path probabilities -> [Q, T] path term: mass of paths through t, plus mass ending at t."""
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
        return (through + ending).T


@dataclass
class RelationPathPrior:
    """MLP weights plus the path vocabulary; ``probs`` and ``path_terms`` run in numpy."""

    w1: np.ndarray  # [d, H]
    b1: np.ndarray  # [H]
    w2: np.ndarray  # [H, V]
    b2: np.ndarray  # [V]
    vocab: np.ndarray  # int64 [V] path codes
    num_relation_ids: int
    info: dict

    @property
    def trie(self) -> PathTrie:
        if not hasattr(self, "_trie"):
            self._trie = PathTrie.build(self.vocab, self.num_relation_ids)
        return self._trie

    def probs(self, query_features: np.ndarray) -> np.ndarray:
        x = np.asarray(query_features, dtype=np.float32)
        logits = _gelu(x @ self.w1 + self.b1) @ self.w2 + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)

    def path_terms(self, query_features: np.ndarray) -> np.ndarray:
        return self.trie.path_terms(self.probs(query_features))

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        np.savez(directory / "prior.npz", w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2, vocab=self.vocab)
        (directory / "prior.json").write_text(json.dumps({"num_relation_ids": self.num_relation_ids, **self.info}, indent=2))

    @classmethod
    def load(cls, directory: Path) -> "RelationPathPrior":
        directory = Path(directory)
        try:
            with np.load(directory / "prior.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in ("w1", "b1", "w2", "b2", "vocab")}
            info = json.loads((directory / "prior.json").read_text())
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"{directory}: cannot read the relation-path prior ({exc}); rerun preprocessing") from exc
        return cls(**arrays, num_relation_ids=int(info.pop("num_relation_ids")), info=info)


def holdout_mask(query_ids: np.ndarray, fraction: float) -> np.ndarray:
    """A stable pseudo-random share of the query ids (Knuth's multiplicative hash)."""
    h = (np.asarray(query_ids, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
    return h < np.uint64(int(fraction * 2**32))


def train_prior(
    query_features: np.ndarray,
    query: np.ndarray,
    code: np.ndarray,
    weight: np.ndarray,
    query_ids: np.ndarray,
    num_relation_ids: int,
    cfg: PriorConfig,
    echo=print,
) -> RelationPathPrior:
    """Fit the prior on target rows (query row, path code, weight) of training questions.

    ``query_features`` [Q, d] holds every training question's features, ``query_ids`` their ids (for
    the hashed hold-out). Questions without a target row are not used.
    """
    import torch

    # Vocabulary: the paths that are targets of the most questions.
    uniq, counts = np.unique(code, return_counts=True)
    order = np.lexsort((uniq, -counts))
    vocab = uniq[order][counts[order] >= cfg.min_count][: cfg.max_paths]
    if len(vocab) == 0:
        raise DataError("no relation path leads from the training questions' seeds to their answers; "
                        "use expand.relation_score=cosine, or check the seeds and expand.hops")
    vocab = np.sort(vocab)
    slot = np.searchsorted(vocab, code)
    in_vocab = vocab[np.minimum(slot, len(vocab) - 1)] == code
    query, slot, weight = query[in_vocab], slot[in_vocab], weight[in_vocab]
    rows = np.unique(query)
    row_of = np.full(len(query_features), -1, np.int64)
    row_of[rows] = np.arange(len(rows))
    targets = np.zeros((len(rows), len(vocab)), dtype=np.float32)
    np.add.at(targets, (row_of[query], slot), weight)
    targets /= targets.sum(axis=1, keepdims=True)
    x = np.asarray(query_features[rows], dtype=np.float32)
    held = holdout_mask(query_ids[rows], cfg.holdout_fraction)
    if held.all() or not held.any():
        held = np.zeros(len(rows), bool)
        held[: max(1, len(rows) // 10)] = True
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    d, hidden = x.shape[1], cfg.hidden_dim
    net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(hidden, len(vocab)))
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    xt, yt = torch.from_numpy(x[~held]), torch.from_numpy(targets[~held])
    xv, yv = torch.from_numpy(x[held]), torch.from_numpy(targets[held])

    def loss_of(xb, yb):
        return -(yb * torch.log_softmax(net(xb), dim=1)).sum(dim=1).mean()

    best, best_state, stale, epoch = float("inf"), None, 0, 0
    for epoch in range(1, cfg.epochs + 1):
        net.train()
        perm = torch.randperm(len(xt), generator=gen)
        for lo in range(0, len(xt), cfg.batch_size):
            idx = perm[lo : lo + cfg.batch_size]
            opt.zero_grad()
            loss = loss_of(xt[idx], yt[idx])
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val = float(loss_of(xv, yv))
        if val < best - 1e-4:
            best, stale = val, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            stale += 1
            if stale >= cfg.patience:
                break
    net.load_state_dict(best_state)
    with torch.no_grad():
        top = net(xv).argmax(dim=1).numpy()
    # Held-out accuracy: the predicted path is one of the question's targets.
    hit = targets[held][np.arange(len(top)), top] > 0
    info = {
        "vocab_size": int(len(vocab)),
        "questions": int(len(rows)),
        "held_out": int(held.sum()),
        "held_out_loss": round(best, 5),
        "held_out_top1_is_target": round(float(hit.mean()) if len(hit) else float("nan"), 4),
        "epochs": epoch,
    }
    echo(f"prior: {len(vocab):,} relation paths, {len(rows):,} questions; held-out loss {best:.4f}, "
         f"top path is a target for {info['held_out_top1_is_target']:.3f} ({epoch} epochs)")
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    return RelationPathPrior(
        w1=sd["0.weight"].T.copy(), b1=sd["0.bias"].copy(), w2=sd["2.weight"].T.copy(), b2=sd["2.bias"].copy(),
        vocab=vocab, num_relation_ids=num_relation_ids, info=info,
    )
