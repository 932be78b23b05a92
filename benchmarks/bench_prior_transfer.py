"""Does the relation-path prior learnt from one set of questions pick the right path for another?

Issue 45's generated-question runs fail mostly in the prior: trained on ``seeder questions`` output, it
must read real users' questions. This benchmark refits the prior of an artifacts directory offline, on
the same golden paths and settings, from different readings of the question, and reports how often its
top path is a target path (F1 at least ``prior.keep_ratio`` of the best, as in training) of the
dataset's questions of another split, per hop:

- ``text``: the features stage's query features (the question's embedding, PCA'd): what the pipeline uses;
- ``masked``: the embedding of the question with each seed's name replaced by "the" and its type
  (``seeder.retrieve.wording.masked_questions``), PCA'd like the features: the question's wording
  without the name that dominates a sentence embedding; what ``prior.question: masked`` reads (taken from
  the prior stage's ``question.npy`` where the artifacts have one);
- ``masked-x``: the names replaced by ``X`` instead (the reading SR and most KBQA relation predictors use);
- ``masked-raw``: ``masked`` without the PCA;
- ``seed-removed``: the query features less their component along the first seed's features, a
  masking that needs no second encoding.

With ``--vote``, each reading is reported twice, the second time with the training questions that are
not generated voting for their paths (``prior.vote: labelled``, ``seeder.retrieve.vote``). With
``--labelled-weights 1,10``, each reading is refitted once per ``prior.labelled_weight``.

Golden paths of the judged split are searched here (preprocessing searches only the training split's).

    python benchmarks/bench_prior_transfer.py --artifacts runs/metaqa/generated-artifacts --split val
    python benchmarks/bench_prior_transfer.py --artifacts A --readings text,masked --examples 10
    python benchmarks/bench_prior_transfer.py --artifacts runs/metaqa/mixed-artifacts --readings masked --vote
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from seeder.config import SeederConfig, from_dict
from seeder.data.store import open_dataset
from seeder.features.embed import PCA, apply_pca, l2_normalize, load_encoder
from seeder.preprocessing.stages import answer_csr, generated_mask, read_golden_paths, read_seed_table, train_query_ids
from seeder.retrieve.paths import describe, golden_paths_batched
from seeder.retrieve.prior import id_hash, path_targets, prior_inputs, seed_relation_profile, train_prior
from seeder.retrieve.vote import LabelledVote
from seeder.retrieve.wording import ENTITY, mask_entities, masked_questions, seed_names

READINGS = ("text", "masked", "masked-x", "masked-raw", "seed-removed")


def target_pairs(kg, cfg: SeederConfig, seeds: np.ndarray, queries: pa.Table) -> set[tuple[int, int]]:
    """(question row, path code) of every target path of these questions."""
    ptr, answers = answer_csr(queries)
    found = golden_paths_batched(kg, seeds, ptr, answers, cfg.expand.hops, cfg.prior)
    order = np.lexsort((found["code"], found["query"]))
    query, code = found["query"][order], found["code"][order]
    counts = np.diff(ptr)[query]
    kept, _, _ = path_targets(
        query, code, found["hits"][order], found["reached"][order], counts, cfg.prior.keep_ratio, 2 * kg.num_relations
    )
    return set(zip(query[kept].tolist(), code[kept].tolist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="a preprocessed artifacts directory with a learned prior")
    parser.add_argument("--split", default="val", help="the questions the refitted priors are judged on")
    parser.add_argument("--readings", default=",".join(READINGS), help=f"comma-separated, of {', '.join(READINGS)}")
    parser.add_argument("--examples", type=int, default=0, help="print this many misses per hop of the last reading")
    parser.add_argument("--vote", action="store_true", help="also report each reading with the labelled questions' vote")
    parser.add_argument(
        "--labelled-weights",
        default="",
        help="comma-separated prior.labelled_weight values to refit each reading with (default: the artifacts' own)",
    )
    parser.add_argument(
        "--labelled-keep",
        type=int,
        default=-1,
        help="keep only this many of the labelled training questions (a hashed choice), to see fewer labels "
        "without preprocessing again; -1 keeps them all",
    )
    args = parser.parse_args()
    readings = args.readings.split(",")
    if unknown := set(readings) - set(READINGS):
        parser.error(f"--readings: unknown {sorted(unknown)}; choose from {', '.join(READINGS)}")

    artifacts = Path(args.artifacts)
    manifest = json.loads((artifacts / "manifest.json").read_text())
    cfg = from_dict(SeederConfig, manifest["config"])
    kg = open_dataset(manifest["dataset"])
    num_ids = 2 * kg.num_relations
    feature_ids = np.load(artifacts / "features" / "query_ids.npy")
    query_features = np.load(artifacts / "features" / "query.npy", mmap_mode="r")
    node_features = np.load(artifacts / "features" / "node.npy", mmap_mode="r")
    seed_ids, all_seeds, _ = read_seed_table(artifacts / "seeds" / "seeds.parquet")
    pca_path = artifacts / "features" / "pca.npz"
    pca = PCA.load(pca_path) if pca_path.exists() else None

    # The prior's training data, as the prior stage builds it.
    train_ids = train_query_ids(kg)
    golden = read_golden_paths(artifacts / "paths")
    qid, code = golden.column("query_id").to_numpy(), golden.column("code").to_numpy()
    kept, weight, _ = path_targets(
        qid,
        code,
        golden.column("hits").to_numpy(),
        golden.column("reached").to_numpy(),
        golden.column("answers").to_numpy(),
        cfg.prior.keep_ratio,
        num_ids,
    )
    train_rows = np.searchsorted(train_ids, qid[kept])
    labelled_questions = ~generated_mask(kg, train_ids)
    if args.labelled_keep >= 0:
        # The labelled questions beyond the first N by a hash of their ids lose their target rows: the fit
        # and the vote then see N labelled questions.
        labelled_ids = train_ids[labelled_questions]
        dropped = np.isin(train_ids, labelled_ids[np.argsort(id_hash(labelled_ids), kind="stable")[args.labelled_keep :]])
        keep_rows = ~dropped[train_rows]
        kept, weight, train_rows = kept[keep_rows], weight[keep_rows], train_rows[keep_rows]
        labelled_questions &= ~dropped
        print(f"{int(labelled_questions.sum()):,} labelled training questions kept, {int(dropped.sum()):,} dropped")

    judged = kg.queries_of(args.split)
    judged_ids = judged.column("id").to_numpy()
    hops = judged.column("hop").to_numpy()
    start = time.perf_counter()
    targets = target_pairs(kg, cfg, all_seeds[np.searchsorted(seed_ids, judged_ids)], judged)
    print(f"{len(judged_ids):,} {args.split} questions, their golden paths in {time.perf_counter() - start:.1f} s")

    encoder = None

    def reading(name: str, ids: np.ndarray) -> np.ndarray:
        nonlocal encoder
        seeds = all_seeds[np.searchsorted(seed_ids, ids)]
        features = np.asarray(query_features[np.searchsorted(feature_ids, ids)], dtype=np.float32)
        if name == "text":
            return features
        if name == "seed-removed":
            direction = l2_normalize(np.asarray(node_features[np.maximum(seeds[:, 0], 0)], dtype=np.float32))
            return features - (features * direction).sum(axis=1, keepdims=True) * direction
        stored = artifacts / "prior" / "question.npy"
        if name == "masked" and stored.exists():  # the prior stage's own masked reading of every question
            stored_ids = np.load(artifacts / "prior" / "question_ids.npy")
            return np.load(stored, mmap_mode="r")[np.searchsorted(stored_ids, ids)]
        texts = kg.queries.column("text").take(pa.array(kg.query_rows(ids))).to_pylist()
        if name == "masked-x":
            masked = [t.replace(ENTITY, "X") for t in mask_entities(texts, seed_names(kg.node_names, seeds))]
        else:
            masked = masked_questions(texts, seed_names(kg.node_names, seeds), seed_names(kg.node_types, seeds))
        encoder = encoder or load_encoder(cfg.embed)
        embedded = l2_normalize(encoder.encode(masked))
        return embedded if name == "masked-raw" else apply_pca(embedded, pca)

    def profile(ids: np.ndarray) -> np.ndarray:
        return seed_relation_profile(kg.indptr, kg.edge_relations, all_seeds[np.searchsorted(seed_ids, ids)], num_ids)

    print(f"| reading | top path a target, hop {' / '.join(str(h) for h in np.unique(hops))} | all | seconds |")
    print("|---|---|---|---|")
    labelled = labelled_questions[train_rows]
    weights = [float(w) for w in args.labelled_weights.split(",")] if args.labelled_weights else [cfg.prior.labelled_weight]
    readings_of: dict[tuple[str, str], np.ndarray] = {}  # each reading encoded once, whatever the weights

    def read(name: str, split: str, ids: np.ndarray) -> np.ndarray:
        if (name, split) not in readings_of:
            readings_of[name, split] = reading(name, ids)
        return readings_of[name, split]

    for name, labelled_weight in ((n, w) for n in readings for w in weights):
        start = time.perf_counter()
        train_reading = read(name, "train", train_ids)
        prior = train_prior(
            prior_inputs(train_reading, profile(train_ids)),
            train_rows,
            code[kept],
            weight,
            train_ids,
            num_ids,
            cfg.prior,
            echo=lambda *_: None,
            question_weight=np.where(labelled_questions, labelled_weight, 1.0),
        )
        judged_inputs = prior_inputs(read(name, args.split, judged_ids), profile(judged_ids))
        votes = [None]
        if args.vote:
            p = cfg.prior
            votes.append(
                LabelledVote.build(
                    train_reading,
                    train_rows[labelled],
                    code[kept][labelled],
                    weight[labelled],
                    prior.vocab,
                    p.vote_temperature,
                    p.vote_floor,
                )
            )
        for vote in votes:
            prior.vote = vote
            top = prior.vocab[prior.probs(judged_inputs).argmax(axis=1)]
            hit = np.array([(row, int(c)) in targets for row, c in enumerate(top.tolist())])
            per_hop = " / ".join(f"{hit[hops == h].mean():.3f}" for h in np.unique(hops))
            label = f"{name}, labelled weight {labelled_weight:g}" + (
                "" if vote is None else f", {vote.size:,} labelled questions vote"
            )
            print(f"| {label} | {per_hop} | {hit.mean():.3f} | {time.perf_counter() - start:.0f} |", flush=True)

    names, texts = kg.relation_names, judged.column("text").to_pylist()
    rng = np.random.default_rng(0)
    for h in np.unique(hops) if args.examples else []:
        misses = np.flatnonzero(~hit & (hops == h))
        for row in rng.choice(misses, size=min(args.examples, len(misses)), replace=False):
            wanted = sorted(c for r, c in targets if r == row)
            print(
                f"  {texts[row][:60]:60s} | prior: {describe(int(top[row]), names)} | "
                f"a target: {describe(wanted[0], names) if wanted else 'none'}"
            )


if __name__ == "__main__":
    main()
