"""Defaults derived from the training split: seeding, hops, the per-hop budget and the relation score.

A graph imported with no config file should still get close to a tuned config. The training questions'
golden relation paths (seeder.retrieve.paths) already say what a tuned config would choose:

- ``seed.strategy: auto``: dense seeds, entity-linked seeds filled up to k0 by dense ones, or the linked
  node alone (``k0 = 1``), whichever gives the training questions the most precise relation paths to
  their answers (the mean F1 of each question's best golden path);
- ``expand.hops: 0`` (auto): the fewest hops that hold the best relation path of ``COVER`` of the
  training questions that have one (paths of up to ``MAX_HOPS`` relations are searched);
- ``expand.keep_per_hop: []`` (auto): the budget split over the hops in proportion to the nodes that
  the training questions' best paths reach at each hop, among the questions whose path gets that far
  (at least ``MIN_SHARE`` of it each);
- ``expand.relation_score: auto``: ``learned`` when at least ``MIN_PATH_SHARE`` of the training questions
  have a golden path (the prior has something to learn), else the paper's ``cosine``;
- the policy's step budget (``train.expansion_sizes`` and ``train.frontier_caps``, recorded in the
  artifacts as ``step_budget`` and used by training unless its config sets them): one expansion step per
  hop, so that a K-hop question's answers are within the policy's reach, each step adding about the
  nodes the best paths reach at its hop (``step_budget``);
- ``prior.wording_dim`` (auto): 0 when most training questions are generated from templates (``seeder
  questions``), whose words are the templates' and say nothing of how people ask; the default otherwise;
- ``prior.question`` (auto): ``masked`` when most training questions are generated, else ``text``;
- ``prior.vote`` (auto): ``labelled`` when some training questions are not generated and they are at
  most half (a few real questions among generated ones), else ``off``.

A config file asks for a derivation by writing these values; ``pipelines/preprocess.py`` run without
``--config`` derives every one of them that the command line does not set (``derive_unset``).

Everything but ``prior.vote`` (which counts the whole split) reads a fixed sample of at most ``SAMPLE``
training questions (chosen by a hash of their ids) and their answers only; val and test answers are never
read. Each choice comes with a line that says why.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seeder.config import AUTO, PriorConfig, SeederConfig
from seeder.preprocessing.stages import answer_csr, generated_mask, train_query_ids
from seeder.retrieve.paths import golden_paths_batched
from seeder.retrieve.prior import id_hash, path_targets
from seeder.retrieve.seeds import EntityLinker, dense_seeds, given_seeds, select_seeds

SAMPLE = 2_000
MAX_HOPS = 3
COVER = 0.97
MIN_SHARE = 0.1
MIN_PATH_SHARE = 0.5
STEP_MIN, STEP_MAX = 5, 30
"""Bounds of a derived expansion step c_t: a step adds at least a few candidates, and a hop that fans
out to hundreds of nodes still adds a set a reranker can read."""
FRONTIER_FACTOR, FRONTIER_MIN, FRONTIER_MAX = 5, 20, 150
"""A derived step's frontier cap: this many times its size, within these bounds (the paper's defaults,
c = [7, 10] with caps [20, 50], give the policy 3-5 candidates per pick)."""
AUTO_STRATEGY = "auto"
AUTO_RELATION_SCORE = "auto"
AUTO_WORDING = -1
"""``prior.wording_dim`` to be derived (set by ``derive_unset``; never a user's value)."""


def derive_unset(config: SeederConfig, overrides: dict) -> SeederConfig:
    """With no config file: mark for derivation every derivable field the command line does not set
    (``expand.keep_per_hop`` given alone fixes ``expand.hops`` to its length)."""
    seed_given = overrides.get("seed", {})
    expand_given = overrides.get("expand", {})
    seed = config.seed if "strategy" in seed_given else dataclasses.replace(config.seed, strategy=AUTO_STRATEGY)
    expand = config.expand
    if "keep_per_hop" not in expand_given:
        expand = dataclasses.replace(expand, keep_per_hop=[])
        if "hops" not in expand_given:
            expand = dataclasses.replace(expand, hops=0)
    elif "hops" not in expand_given:
        expand = dataclasses.replace(expand, hops=len(expand.keep_per_hop))
    if "relation_score" not in expand_given:
        expand = dataclasses.replace(expand, relation_score=AUTO_RELATION_SCORE)
    prior = config.prior
    if "wording_dim" not in overrides.get("prior", {}):
        prior = dataclasses.replace(prior, wording_dim=AUTO_WORDING)
    if "question" not in overrides.get("prior", {}):
        prior = dataclasses.replace(prior, question=AUTO)
    if "vote" not in overrides.get("prior", {}):
        prior = dataclasses.replace(prior, vote=AUTO)
    return dataclasses.replace(config, seed=seed, expand=expand, prior=prior)


def needs_derivation(config: SeederConfig) -> bool:
    e = config.expand
    return (
        config.seed.strategy == AUTO_STRATEGY
        or e.hops == 0
        or not e.keep_per_hop
        or e.relation_score == AUTO_RELATION_SCORE
        or config.prior.wording_dim == AUTO_WORDING
        or config.prior.question == AUTO
        or config.prior.vote == AUTO
    )


def _sample(kg) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], float]:
    """(query ids, answer_ptr, answers, texts, share generated by ``seeder questions``) of a fixed hashed
    sample of the training questions."""
    train = kg.queries_of("train").sort_by("id")
    ids = train.column("id").to_numpy()
    if len(ids) > SAMPLE:
        keep = np.sort(np.argsort(id_hash(ids), kind="stable")[:SAMPLE])
        train = train.take(keep)
        ids = ids[keep]

    ptr, answers = answer_csr(train)
    generated = train.column("generated").to_numpy(zero_copy_only=False) if "generated" in train.column_names else []
    return ids, ptr, answers, train.column("text").to_pylist(), float(np.mean(generated)) if len(generated) else 0.0


def _best_paths(found: dict[str, np.ndarray], num_ids: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per query with a golden path: (query, code, length, F1) of its best path by F1, shorter first on ties."""
    good = found["hits"] > 0
    q, code, length = found["query"][good], found["code"][good], found["length"][good].astype(np.int64)
    if len(q) == 0:
        return q, code, length, np.zeros(0)
    _, _, f1 = path_targets(q, code, found["hits"][good], found["reached"][good], found["answers_of"][good], 1.0, num_ids)
    order = np.lexsort((length, -f1, q))
    first = np.r_[True, q[order][1:] != q[order][:-1]]
    pick = order[first]
    return q[pick], code[pick], length[pick], f1[pick]


def derive_defaults(
    kg, node_features: np.ndarray, query_features: np.ndarray, query_ids: np.ndarray, config: SeederConfig
) -> tuple[SeederConfig, list[str]]:
    """``config`` with its ``auto`` values resolved from the training split, and one line per choice."""
    if not needs_derivation(config):
        return config, []
    seed_cfg, expand = config.seed, config.expand
    lines: list[str] = []
    ids, ptr, answers, texts, generated = _sample(kg)
    num_q = len(ids)
    if config.prior.wording_dim == AUTO_WORDING:
        # Generated questions' words are the templates' (seeder.generate.questions.TEMPLATES): wording features
        # learnt from them fit the templates and not how people ask. On MetaQA's real val questions a
        # prior trained on generated ones alone covered 0.970 of 3-hop questions without them, 0.927 with.
        wording = 0 if generated >= 0.5 else PriorConfig().wording_dim
        lines.append(
            f"auto: prior.wording_dim={wording} ({generated:.2f} of the training questions are generated "
            f"from templates; the prior reads their wording only when fewer than half are)"
        )
        config = dataclasses.replace(config, prior=dataclasses.replace(config.prior, wording_dim=wording))
    if config.prior.question == AUTO:
        # The same reason: a generated question's embedding is mostly its anchor's name and the template;
        # with the names masked the prior reads the relation words, which real questions share with it.
        question = "masked" if generated >= 0.5 else "text"
        lines.append(
            f"auto: prior.question={question} ({generated:.2f} of the training questions are generated; the prior "
            "reads them with their seeds' names masked when at least half are)"
        )
        config = dataclasses.replace(config, prior=dataclasses.replace(config.prior, question=question))
    if config.prior.vote == AUTO:
        # Counted over the whole training split, not the sample: ten real questions among 25,000
        # generated ones are rarely in a sample, and they are what the vote is for.
        train = train_query_ids(kg)
        labelled = int((~generated_mask(kg, train)).sum())
        vote = "labelled" if 0 < labelled <= len(train) / 2 else "off"
        lines.append(
            f"auto: prior.vote={vote} ({labelled:,} of {len(train):,} training questions are not generated; they "
            "vote for their paths when they are at most half)"
        )
        config = dataclasses.replace(config, prior=dataclasses.replace(config.prior, vote=vote))
    search = dataclasses.replace(config.prior, path_cap=64)
    max_hops = expand.hops or MAX_HOPS

    def paths_from(seeds: np.ndarray, length: int, every: bool = False) -> dict[str, np.ndarray]:
        found = golden_paths_batched(kg, seeds, ptr, answers, length, search, every_path=every)
        found["answers_of"] = np.diff(ptr)[found["query"]]
        return found

    if num_q == 0:
        resolved_seed = dataclasses.replace(seed_cfg, strategy="dense") if seed_cfg.strategy == AUTO_STRATEGY else seed_cfg
        hops = expand.hops or 2
        keep = expand.keep_per_hop or _split(expand.budget - seed_cfg.k0, np.ones(hops))
        score = "cosine" if expand.relation_score == AUTO_RELATION_SCORE else expand.relation_score
        lines.append("auto: no training questions with answers; the paper's settings (dense seeds, cosine relation score)")
        sizes, caps = step_budget(np.full(hops, float(STEP_MIN)))
        return dataclasses.replace(
            config,
            seed=resolved_seed,
            expand=dataclasses.replace(expand, hops=hops, keep_per_hop=list(keep), relation_score=score),
            train=dataclasses.replace(config.train, expansion_sizes=sizes, frontier_caps=caps),
        ), lines

    rows = np.searchsorted(query_ids, ids)
    q_features = np.asarray(query_features[rows], dtype=np.float32)
    dense_ids, dense_scores = dense_seeds(
        q_features, node_features, seed_cfg.k0, seed_cfg.block_nodes, seed_cfg.block_queries, screen=seed_cfg.screen
    )
    if seed_cfg.strategy == AUTO_STRATEGY:
        linked = EntityLinker(kg, seed_cfg).link(texts)
        named = float(np.mean([len(x) > 0 for x in linked]))
        # Candidates: dense seeds, linked-then-dense seeds, and the linked node alone (dense fills in
        # where none is named). The one whose best golden paths are most precise wins: extra seeds
        # reach more answers only by reaching many more non-answers.
        candidates = {
            ("dense", seed_cfg.k0): None,
            ("dense+entity", seed_cfg.k0): linked,
            ("dense+entity", 1): linked,
        }
        scores = {}
        for (strategy, k0), links in candidates.items():
            trial = dataclasses.replace(seed_cfg, strategy=strategy, k0=k0)
            seeds_k, _ = select_seeds(trial, dense_ids[:, :k0], dense_scores[:, :k0], links)
            # Mean over the sampled questions of their best path's F1 (0 without one).
            best_f1 = _best_paths(paths_from(seeds_k, max_hops), 2 * kg.num_relations)[3].sum() / num_q
            scores[(strategy, k0)] = (float(best_f1), seeds_k)
        (strategy, k0), (f1, seeds) = max(scores.items(), key=lambda kv: (kv[1][0] + 1e-9 * (kv[0][1] == 1), -kv[0][1]))
        shown = ", ".join(f"{s} k0={k}: {v[0]:.2f}" for (s, k), v in scores.items())
        lines.append(
            f"auto: seed.strategy={strategy} seed.k0={k0} (mean F1 of the training questions' best relation "
            f"path within {max_hops} hops from the seeds: {shown}; {named:.2f} of {num_q:,} questions name a node)"
        )
        seed_cfg = dataclasses.replace(seed_cfg, strategy=strategy, k0=k0)
    else:
        linked = None
        if seed_cfg.strategy in ("entity", "dense+entity"):
            linked = EntityLinker(kg, seed_cfg).link(texts)
        elif seed_cfg.strategy == "given":
            linked = given_seeds(kg, ids, seed_cfg.given_attribute)
        strategy = {"given": "dense+entity", "bm25": "dense", "hybrid": "dense"}.get(seed_cfg.strategy, seed_cfg.strategy)
        seeds, _ = select_seeds(dataclasses.replace(seed_cfg, strategy=strategy), dense_ids, dense_scores, linked)

    found = paths_from(seeds, max_hops, every=True)
    best_q, best_code, best_len, _ = _best_paths(found, 2 * kg.num_relations)
    share = len(best_q) / num_q
    hops = expand.hops
    if hops == 0:
        if len(best_len):
            counts = np.bincount(best_len, minlength=MAX_HOPS + 1)[1:]
            cumulative = np.cumsum(counts) / counts.sum()
            hops = int(np.searchsorted(cumulative, COVER - 1e-9) + 1)
            dist = ", ".join(f"{h + 1} hop{'s' if h else ''} {c / counts.sum():.2f}" for h, c in enumerate(counts))
            lines.append(
                f"auto: expand.hops={hops} (the best relation path of {COVER:.0%} of the training questions "
                f"that have one has at most {hops}; {dist})"
            )
        else:
            hops = 2
            lines.append(
                "auto: expand.hops=2 (no training question has an answer within "
                f"{MAX_HOPS} hops of its seeds: the paper's default)"
            )
    keep = list(expand.keep_per_hop)
    on_path = _nodes_on_best_paths(found, best_q, best_code, best_len, hops, 2 * kg.num_relations)
    if not keep or len(keep) != hops:
        keep = _split(expand.budget - seed_cfg.k0, on_path)
        lines.append(
            f"auto: expand.keep_per_hop={keep} (budget {expand.budget} less {seed_cfg.k0} seeds, split as the "
            f"nodes the training questions' best paths reach per hop: "
            f"{' / '.join(f'{x:.1f}' for x in on_path)})"
        )
    score = expand.relation_score
    if score == AUTO_RELATION_SCORE:
        score = "learned" if share >= MIN_PATH_SHARE else "cosine"
        lines.append(
            f"auto: expand.relation_score={score} ({share:.2f} of the training questions have a golden "
            f"relation path; the prior is learnt from them when at least {MIN_PATH_SHARE:.2f} do)"
        )
    sizes, caps = step_budget(on_path)
    lines.append(
        f"auto: train.expansion_sizes={sizes} train.frontier_caps={caps} (one policy step per hop, each "
        f"adding about the nodes the training questions' best paths reach at its hop, within "
        f"[{STEP_MIN}, {STEP_MAX}]; caps {FRONTIER_FACTOR}x a step; training's own config may set them)"
    )
    resolved = dataclasses.replace(
        config,
        seed=seed_cfg,
        expand=dataclasses.replace(expand, hops=hops, keep_per_hop=keep, relation_score=score),
        train=dataclasses.replace(config.train, expansion_sizes=sizes, frontier_caps=caps),
    )
    return resolved, lines


def step_budget(nodes_per_hop: np.ndarray) -> tuple[list[int], list[int]]:
    """The policy's (expansion sizes, frontier caps): one step per hop, step t adding the nodes the
    paths reach at hop t (rounded up, within [STEP_MIN, STEP_MAX]), its frontier FRONTIER_FACTOR times
    that. The paper sets T and c_t of Algorithm 1 by hand; a fixed T below the hops a question needs
    leaves its answers out of reach, however well the policy learns."""
    sizes = np.clip(np.ceil(np.asarray(nodes_per_hop, dtype=np.float64) - 1e-9), STEP_MIN, STEP_MAX).astype(int)
    caps = np.clip(FRONTIER_FACTOR * sizes, FRONTIER_MIN, FRONTIER_MAX)
    return [int(x) for x in sizes], [int(x) for x in caps]


def _nodes_on_best_paths(found, best_q, best_code, best_len, hops: int, num_ids: int) -> np.ndarray:
    """Per hop h = 1..K, the mean number of nodes that the questions' best paths reach at hop h, over
    the questions whose best path has at least h hops (what hop h's share of the budget must hold)."""
    out = np.zeros(hops)
    if len(best_q) == 0:
        return np.ones(hops)
    keys = found["query"].astype(np.int64), found["code"]
    order = np.lexsort((keys[1], keys[0]))
    fq, fc, fr = keys[0][order], keys[1][order], found["reached"][order]
    for h in range(1, hops + 1):
        long_enough = best_len >= h
        prefix = best_code[long_enough] // num_ids ** (best_len[long_enough] - h)
        q = best_q[long_enough]
        # (query, code) lookup in the sorted rows of every path.
        pos = np.searchsorted(fq * (fc.max(initial=0) + 1) + fc, q * (fc.max(initial=0) + 1) + prefix)
        pos = np.minimum(pos, len(fq) - 1)
        hit = (fq[pos] == q) & (fc[pos] == prefix)
        out[h - 1] = fr[pos][hit].sum() / max(int(long_enough.sum()), 1)
    return np.maximum(out, 1e-3)


def _split(budget: int, weights: np.ndarray) -> list[int]:
    """``budget`` split over hops in proportion to ``weights``, at least MIN_SHARE of it each."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    w = np.maximum(w, MIN_SHARE)
    w = w / w.sum()
    keep = np.floor(w * budget).astype(int)
    keep[-1] += budget - keep.sum()
    return [int(x) for x in np.maximum(keep, 1)]
