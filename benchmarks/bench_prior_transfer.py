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
  masking that needs no second encoding;
- ``finetuned``: the masked question read by the encoder itself, fine-tuned end to end with the prior's
  per-hop head on the training questions (``--finetune-epochs`` epochs, a row per epoch), in the place of
  the frozen embedding and the MLP: how much of the gap an encoder that learns which words name a
  relation would close (SR, Zhang et al. 2022, fine-tunes its question encoder this way).

The ``masked`` reading is also reported with the artifacts' own path-text match
(``seeder.retrieve.path_text``, at the weight the prior stage chose), where their prior has one, and then
with the asked type too (``seeder.retrieve.answer_type``).
With ``--vote``, each reading is reported twice, the second time with the training questions that are
not generated voting for their paths (``prior.vote: labelled``, ``seeder.retrieve.vote``). With
``--labelled-weights 1,10``, each reading is refitted once per ``prior.labelled_weight``.

Golden paths of the judged split are searched here (preprocessing searches only the training split's).

    python benchmarks/bench_prior_transfer.py --artifacts runs/metaqa/generated-artifacts --split val
    python benchmarks/bench_prior_transfer.py --artifacts A --readings text,masked --examples 10
    python benchmarks/bench_prior_transfer.py --artifacts runs/metaqa/mixed-artifacts --readings masked --vote
    python benchmarks/bench_prior_transfer.py --artifacts runs/metaqa/generated-artifacts --readings masked,finetuned
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
from seeder.features.embed import PCA, apply_pca, l2_normalize, load_encoder, minilm_path
from seeder.preprocessing.stages import answer_csr, generated_mask, read_golden_paths, read_seed_table, train_query_ids
from seeder.retrieve.paths import describe, golden_paths_batched, path_digits, path_length
from seeder.retrieve.prior import (
    RelationPathPrior,
    all_paths,
    id_hash,
    path_targets,
    prior_inputs,
    seed_relation_profile,
    train_prior,
)
from seeder.retrieve.vote import LabelledVote
from seeder.retrieve.wording import ENTITY, mask_entities, masked_questions, seed_names

READINGS = ("text", "masked", "masked-x", "masked-raw", "seed-removed", "finetuned")


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


def finetuned_top_paths(
    encoder_path: Path,
    train_texts: list[str],
    train_profile: np.ndarray,
    targets: np.ndarray,
    question_weight: np.ndarray,
    judged_texts: list[str],
    judged_profile: np.ndarray,
    vocab: np.ndarray,
    epochs: int,
    lr: float,
    seed: int,
):
    """Yield, after each epoch, the top vocabulary path of every judged question under the encoder
    fine-tuned with a ``prior.model: hops`` head (``targets`` [N, V]: each training question's target
    weights, rows summing to 1). Same loss and profile mask as ``seeder.retrieve.prior``."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(seed)
    num_ids = train_profile.shape[1]
    digits = path_digits(vocab, num_ids)  # relation at each hop, -1 past the path's end (never indexed)
    hops = digits.shape[1]
    length_t, first = torch.from_numpy(path_length(vocab, num_ids)), torch.from_numpy(digits[:, 0].copy())
    digits = torch.from_numpy(digits)
    tokenizer, encoder = AutoTokenizer.from_pretrained(encoder_path), AutoModel.from_pretrained(encoder_path)
    dim = encoder.config.hidden_size
    head = torch.nn.Sequential(torch.nn.Linear(dim + num_ids, 256), torch.nn.GELU(), torch.nn.Linear(256, hops * (num_ids + 1)))

    def log_probs(texts: list[str], profile: torch.Tensor) -> torch.Tensor:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (encoder(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)
        blocks = torch.log_softmax(head(torch.cat([torch.nn.functional.normalize(pooled, dim=1), profile], 1)), -1)
        blocks = blocks.view(len(texts), hops, num_ids + 1)
        # log p(r_1..r_l) = sum_h log p_h(r_h) + log p_{l+1}(stop), as RelationPathPrior._path_products.
        out = torch.zeros(len(texts), len(vocab))
        for h in range(hops):
            on = length_t > h
            out[:, on] += blocks[:, h, digits[on, h]]
            if h + 1 < hops:
                out[:, length_t == h + 1] += blocks[:, h + 1, num_ids, None]
        out = out.masked_fill(profile[:, first] <= 0, -1e9)  # the seeds lack the first relation
        return out - torch.logsumexp(out, 1, keepdim=True)

    optimiser = torch.optim.AdamW(
        [{"params": encoder.parameters(), "lr": lr}, {"params": head.parameters(), "lr": 2e-3}], weight_decay=1e-4
    )
    targets_t, weight_t = torch.from_numpy(targets), torch.from_numpy(question_weight.astype(np.float32))
    train_profile_t, judged_profile_t = torch.from_numpy(train_profile), torch.from_numpy(judged_profile)
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        encoder.train()
        order = rng.permutation(len(train_texts))
        start = time.perf_counter()
        for step, at in enumerate(range(0, len(order), 32)):
            rows = order[at : at + 32]
            lp = log_probs([train_texts[r] for r in rows], train_profile_t[rows])
            loss = (-(targets_t[rows] * lp.clamp_min(-1e4)).sum(1) * weight_t[rows]).sum() / weight_t[rows].sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            if step % 100 == 0:
                done = (at + len(rows)) / len(order)
                eta = (time.perf_counter() - start) * (1 - done) / done
                print(f"  fine-tuning, epoch {epoch + 1}: {done:.0%}, loss {loss.item():.3f}, ETA {eta:.0f} s", flush=True)
        encoder.eval()
        with torch.no_grad():
            tops = [
                log_probs(judged_texts[at : at + 256], judged_profile_t[at : at + 256]).argmax(1).numpy()
                for at in range(0, len(judged_texts), 256)
            ]
        yield epoch + 1, vocab[np.concatenate(tops)]


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
    parser.add_argument("--finetune-epochs", type=int, default=2, help="epochs of the finetuned reading")
    parser.add_argument(
        "--finetune-questions", type=int, default=0, help="fine-tune on this many training questions (a hashed choice); 0: all"
    )
    parser.add_argument("--finetune-lr", type=float, default=3e-5, help="the encoder's learning rate in the finetuned reading")
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
    stored = RelationPathPrior.load(artifacts / "prior") if (artifacts / "prior" / "prior.json").exists() else None
    stored_text, stored_vocab = (stored.path_text, stored.vocab) if stored is not None else (None, np.zeros(0))
    stored_types = stored.answer_types if stored is not None else None
    stored_mlp_width = stored.local_match.offset if stored is not None and stored.local_match is not None else None

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
            rows = np.load(stored, mmap_mode="r")[np.searchsorted(stored_ids, ids)]
            return rows[:, :stored_mlp_width]  # not the windows of a local match: the MLP does not read them
        encoder = encoder or load_encoder(cfg.embed)
        embedded = l2_normalize(encoder.encode(masked_texts(name, ids)))
        return embedded if name == "masked-raw" else apply_pca(embedded, pca)

    def masked_texts(name: str, ids: np.ndarray) -> list[str]:
        seeds = all_seeds[np.searchsorted(seed_ids, ids)]
        texts = kg.queries.column("text").take(pa.array(kg.query_rows(ids))).to_pylist()
        if name == "masked-x":
            return [t.replace(ENTITY, "X") for t in mask_entities(texts, seed_names(kg.node_names, seeds))]
        return masked_questions(texts, seed_names(kg.node_names, seeds), seed_names(kg.node_types, seeds))

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

    def report(label: str, top: np.ndarray, start: float) -> np.ndarray:
        hit = np.array([(row, int(c)) in targets for row, c in enumerate(top.tolist())])
        per_hop = " / ".join(f"{hit[hops == h].mean():.3f}" for h in np.unique(hops))
        print(f"| {label} | {per_hop} | {hit.mean():.3f} | {time.perf_counter() - start:.0f} |", flush=True)
        return hit

    for name, labelled_weight in ((n, w) for n in readings for w in weights):
        start = time.perf_counter()
        if name == "finetuned":
            if cfg.prior.model != "hops" or cfg.embed.encoder != "minilm":
                raise SystemExit("--readings finetuned: needs prior.model hops and the minilm encoder")
            # Each training question's target weights over every path, as the prior's fit normalises them.
            vocab = all_paths(num_ids, int(path_length(code[kept], num_ids).max()))
            has_target = np.zeros(len(train_ids), bool)
            has_target[train_rows] = True
            fitted = np.flatnonzero(has_target)
            if args.finetune_questions:
                fitted = np.sort(fitted[np.argsort(id_hash(train_ids[fitted]), kind="stable")[: args.finetune_questions]])
            target = np.zeros((len(fitted), len(vocab)), np.float32)
            on = np.isin(train_rows, fitted)
            np.add.at(target, (np.searchsorted(fitted, train_rows[on]), np.searchsorted(vocab, code[kept][on])), weight[on])
            target /= target.sum(axis=1, keepdims=True)
            epochs = finetuned_top_paths(
                minilm_path(),
                masked_texts(name, train_ids[fitted]),
                profile(train_ids[fitted]),
                target,
                np.where(labelled_questions[fitted], labelled_weight, 1.0),
                masked_texts(name, judged_ids),
                profile(judged_ids),
                vocab,
                args.finetune_epochs,
                args.finetune_lr,
                cfg.prior.seed,
            )
            for epoch, top in epochs:
                hit = report(f"{name}, epoch {epoch}, labelled weight {labelled_weight:g}", top, start)
            continue
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
        matches = [(None, None)]
        if name == "masked" and np.array_equal(stored_vocab, prior.vocab):
            matches += [(stored_text, None)] if stored_text is not None else []
            matches += [(stored_text, stored_types)] if stored_types is not None else []
        for text, types in matches:
            prior.path_text, prior.answer_types = text, types
            for vote in votes:
                prior.vote = vote
                top = prior.vocab[prior.probs(judged_inputs).argmax(axis=1)]
                label = (
                    f"{name}, labelled weight {labelled_weight:g}"
                    + ("" if text is None else f", path text weight {text.weight:g}")
                    + ("" if types is None else ", asked type")
                    + ("" if vote is None else f", {vote.size:,} labelled questions vote")
                )
                hit = report(label, top, start)

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
