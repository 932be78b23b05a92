"""Typed configuration: dataclasses with a docstring per field, loaded from YAML, overridden from the CLI.

Every default lives here and nowhere else. A config file (``configs/*.yaml``) names only what differs
from these defaults; command-line overrides use dotted keys (``train.lr=3e-4 expand.budget=150``)
whose values are parsed as YAML scalars or lists.

Each section is owned by one stage of the pipeline:

- ``embed``, ``reduce``, ``seed``, ``expand``: preprocessing (``seeder.features.embed``, ``seeder.retrieve``)
- ``model``: the policy network (``seeder.policy.model``)
- ``train``: REINFORCE + BPR training (``seeder.training.loop``)
- ``eval``: metrics and rankings (``seeder.retrieve.metrics``)
- ``synth``: the synthetic graph generator (``seeder.generate.synth``)
- ``questions``: questions generated from a graph's paths (``seeder.generate.questions``)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message says which key and why."""


# Every choice field is a Literal: its values are checked in one place (``Section.__post_init__``), for
# configs from YAML, from overrides and built in code alike, and the modules read their choices from here.
SeedStrategy = Literal["dense", "entity", "dense+entity", "bm25", "hybrid", "given", "auto"]
ParentTerm = Literal["similarity", "score"]
RelationScore = Literal["cosine", "learned", "auto"]
PriorModel = Literal["hops", "path"]
PriorQuestion = Literal["text", "masked", "auto"]
PriorVote = Literal["off", "labelled", "auto"]
QueryInjection = Literal["add", "concat"]
Baseline = Literal["group_mean", "none", "greedy"]
TrainMode = Literal["seeder", "rerank"]
Pruning = Literal["none", "simple", "gw", "strong"]
EncoderBackend = Literal["auto", "torch", "sentence-transformers"]
CpuPrecision = Literal["float32", "bfloat16", "int8"]
SeedScreen = Literal["auto", "float32", "bfloat16"]
SeedSearch = Literal["exact", "ann", "auto"]
Fusion = Literal["rrf", "votes"]
AUTO = "auto"
"""The value of a choice that preprocessing derives from the training split (seeder.preprocessing.derive)."""


def choices(kind: Any, auto: bool = False) -> tuple[str, ...]:
    """The values of a choice type, without ``auto`` unless asked: ``choices(SeedStrategy)``."""
    return tuple(v for v in get_args(kind) if auto or v != AUTO)


@lru_cache(maxsize=None)
def _choice_fields(cls: type) -> dict[str, tuple[str, ...]]:
    hints = get_type_hints(cls)
    return {name: get_args(kind) for name, kind in hints.items() if get_origin(kind) is Literal}


class Section:
    """Base of every config section: checks its choice fields when it is built."""

    def __post_init__(self) -> None:
        section = getattr(self, "section", None) or type(self).__name__.removesuffix("Config").lower()
        for name, allowed in _choice_fields(type(self)).items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"{section}.{name}={value!r}: use one of {', '.join(allowed)}")


@dataclass
class EmbedConfig(Section):
    encoder: str = "minilm"
    """Text encoder: ``minilm`` (the bundled all-MiniLM-L6-v2 weights), ``hash`` (fast, deterministic,
    no model: for scale tests and CI), or a local sentence-transformers model directory."""
    batch_size: int = 64
    """Texts per encoder forward pass on CPU (64 was as fast as 128 there)."""
    gpu_batch_size: int = 512
    """Texts per encoder forward pass on a GPU. Larger passes keep a GPU busy: on an H200 MiniLM took 2.9x
    less time at 512 than at 64 (benchmarks/RESULTS.md)."""
    num_actors: int = 0
    """Ray Data actors for the embedding stage; 0 picks ``actors_per_gpu`` per GPU, or one per
    ``cpus_per_actor`` CPUs without GPUs."""
    actors_per_gpu: int = 4
    """Embedding actors sharing each GPU (each asks Ray for 1/actors_per_gpu of one): while one
    tokenizes its texts and hands results back, another runs MiniLM (on an H100, 1.4x the texts/s of one actor per GPU;
    benchmarks/RESULTS.md)."""
    cpus_per_actor: float = 1.0
    """CPUs per CPU embedding actor; torch threads are set to match. One single-threaded MiniLM per core
    embedded 1.26x the texts/s of one process with two threads on a 2-core machine (small GEMMs scale
    poorly across threads)."""
    half_precision: bool = True
    """Encode in float16 on GPU actors (ignored on CPU: see ``cpu_precision``)."""
    cpu_precision: CpuPrecision = "float32"
    """Number format of a transformer encoder on CPU (plain-torch backend only unless ``float32``).
    ``bfloat16`` halves MiniLM's time per text on CPUs with native bfloat16 (AVX512-BF16 or AMX), with embeddings
    within cosine 0.9999 of float32; without native support it is
    emulated and slower. ``int8`` runs the linear layers as int8 GEMMs with per-token activation
    scales (``seeder.features.bert.int8_linear``), faster than bfloat16 (benchmarks/RESULTS.md), with
    embeddings within cosine ~0.997 of float32. Part of the embed stage's fingerprint when not
    ``float32``. A retriever may encode questions in another format than its artifacts
    (``Retriever.load(encoder_precision=...)``)."""
    hash_dim: int = 384
    """Output dimension of the ``hash`` encoder."""
    max_seq_length: int = 256
    """Tokens kept per text by the transformer encoder."""
    backend: EncoderBackend = "auto"
    """How a transformer encoder runs: ``torch`` (seeder.features.bert, plain torch for mean-pooled BERTs such as
    MiniLM: no transformers import, less Python per call), ``sentence-transformers``, or ``auto`` (torch
    where the model is such a BERT). Both give the same embeddings to float32 rounding, so the choice is
    not part of the embed stage's fingerprint."""


@dataclass
class ReduceConfig(Section):
    dim: int = 256
    """PCA output dimension (paper, Appendix D.1); 0 keeps the encoder's dimension."""
    fit_sample: int = 100_000
    """Node embeddings sampled to fit the PCA, which is then applied to all rows."""
    seed: int = 0
    """Random seed of the PCA sample."""
    bfloat16_from_nodes: int = 4_000_000
    """From this many nodes up, the features stage also writes a bfloat16 copy of the node features
    and K-HOP's filter reads it (seeder.features.bfloat16): half the bytes per candidate row, so an
    expansion worker at ten million nodes maps 5 GB instead of 10. Cosines move by at most about 2^-8,
    so near-ties may rank differently; seeds and the policy keep float32. 0: never."""


@dataclass
class SeedConfig(Section):
    k0: int = 3
    """Seeds per query: the top-k0 nodes by cosine (paper, Section 3)."""
    strategy: SeedStrategy = "dense"
    """``dense`` (cosine), ``entity`` (node names found in the query text), ``dense+entity``
    (entity-linked nodes first, then dense seeds up to k0), ``bm25`` (BM25 over node text, dense seeds
    filling queries without a term match), ``hybrid`` (BM25 and dense fused by reciprocal rank) or
    ``given`` (the node named by the query attribute ``seed.given_attribute``, e.g. MetaQA's bracketed
    topic entity; dense seeds fill queries without one)."""
    given_attribute: str = "topic_id"
    """The query attribute (a node id column of queries.parquet) that ``strategy: given`` seeds from."""
    entity_min_chars: int = 3
    """Shortest node name that entity linking matches (avoids matching ``a``, ``II``...)."""
    entity_max: int = 3
    """At most this many entity-linked seeds per query (rarest mention first, see EntityLinker)."""
    block_nodes: int = 16_384
    """Nodes per block in the exact blocked top-k search (bounds memory at millions of nodes: one
    block of scores is block_queries x block_nodes float32, 32 MiB at the defaults; small blocks stay
    in cache, and after the first block only scores above each query's running k-th best are kept)."""
    block_queries: int = 512
    """Queries per block in the exact blocked top-k search."""
    screen: SeedScreen = "auto"
    """Precision of the matrix product that screens each block of the exact search before the few
    nodes near a query's top-k are scored exactly (``seeder.retrieve.seeds.dense_seeds``): the seeds
    are the same either way. ``auto`` is ``bfloat16`` on CPUs with native bfloat16 products (AVX512-BF16
    or AMX), where it runs 2-3x as fast as ``float32``, and ``float32`` elsewhere."""
    search: SeedSearch = "auto"
    """How dense seeds are found: ``exact`` (the blocked top-k over every node), ``ann`` (an inverted-file
    index, ``seeder.retrieve.ann``, whose candidates are re-scored exactly) or ``auto``: ``ann`` for
    graphs of at least ``ann_min_nodes`` nodes when at least 10 queries per index list are seeded at
    once (so that building the index pays off), else ``exact``. How well the index does depends on the
    features: on tight clusters it finds every exact seed scanning a few lists, while on the 1M-node
    hash-encoded synthetic graph it found under 0.8 of the exact top-3 even scanning a tenth of the
    lists (benchmarks/bench_seeds.py); so ``auto`` measures the index's recall on a sample of the
    queries and seeds exactly below ``ann_min_recall``."""
    ann_min_nodes: int = 500_000
    """``search: auto`` uses the index from this many nodes up (MetaQA's 43K nodes stay exact: exact
    search of all its questions takes seconds)."""
    ann_nlist: int = 0
    """Lists (k-means centroids) of the index; 0 derives ``ann_nlist_factor * sqrt(nodes)``, capped so
    that each list has at least 39 training rows. Building costs nodes x nlist products."""
    ann_nlist_factor: float = 1.0
    """``ann_nlist = ann_nlist_factor * sqrt(nodes)`` when ``ann_nlist`` is 0 (1,000 lists at 1M nodes)."""
    ann_nprobe: int = 32
    """Lists each query scans (the nearest centroids first): recall and search time grow with it; at
    ``nprobe = nlist`` the search is exact."""
    ann_extra: int = 8
    """Candidates taken from the index beyond k0 and re-scored exactly, so that ties at the k0-th score
    break by the smaller id as in exact search."""
    ann_train_sample: int = 65_536
    """Node rows (a seeded sample) the index's k-means is trained on."""
    ann_seed: int = 0
    """Seed of the training sample and the k-means initialisation."""
    ann_min_recall: float = 0.95
    """``search: auto`` only: when the index's top-k0 recall against exact search, measured on a sample of
    1,000 queries, falls below this, preprocessing seeds every query exactly instead (and says so)."""


@dataclass
class ExpandConfig(Section):
    budget: int = 200
    """B: nodes kept in each query's bounded subgraph, seeds included (paper: 100-200)."""
    hops: int = 2
    """K: hops of K-HOP-WITH-FILTERING; 0 (auto, together with ``keep_per_hop: []``) derives them from
    the training split (seeder.preprocessing.derive)."""
    keep_per_hop: list[int] = field(default_factory=lambda: [60, 140])
    """b_h: nodes kept at each hop by filter score (the total is capped by ``budget``)."""
    neighbor_cap: int = 1_000
    """At most this many neighbours of one frontier node are scored (beyond that, a fixed sample: the
    first entries of its CSR slice in edge-hash order), so a hub with 100K neighbours costs no more
    than this cap."""
    candidate_cap: int = 20_000
    """At most this many candidate edges scored per hop and query."""
    weights: list[float] = field(default_factory=lambda: [1 / 3, 1 / 3, 1 / 3])
    """Weights of sim(q,u), sim(q,v) and sim(q,r) in the filter score (paper, Section 3)."""
    parent_term: ParentTerm = "similarity"
    """What the w2 term reads from the source node v: ``similarity`` (sim(q,v), the paper's) or
    ``score`` (v's own filter score, so the relations of the whole path from the seed add up and a
    multi-hop question's relation chain outranks hub neighbourhoods)."""
    batch_queries: int = 256
    """Queries expanded by one call of the compiled expansion (``seeder.retrieve.khop_kernels``): bounds
    the memory of a call's output arrays; results do not depend on it."""
    resident_features_gb: float = 4.0
    """Node-feature pages (GiB) one expansion worker keeps mapped from block to block. A block reads
    node rows from all over the features, so a worker would otherwise come to hold the whole file (10
    GB at ten million nodes); past this it lets them go (seeder.system.mapped) and later blocks map
    theirs again from the page cache. Results do not depend on it."""
    relation_score: RelationScore = "cosine"
    """The w3 term: ``cosine`` (sim(q,r), the paper's) or ``learned``: the relation-path prior's
    probability mass of the candidate's relation path from the seed (the parent's path plus this edge's
    relation), plus the mass of paths that end there (see ``prior`` and seeder.retrieve.prior)."""


@dataclass
class PriorConfig(Section):
    """Golden relation paths of the training questions and the relation-path prior learnt from them
    (used by ``expand.relation_score: learned``)."""

    model: PriorModel = "hops"
    """``hops``: one softmax over the relation ids (and "stop") per hop, multiplied along a path, so
    relation paths never seen whole in training still get their mass (compositional questions);
    ``path``: one softmax over a vocabulary of whole relation paths seen in training."""
    bag_weight: float = 0.0
    """``hops`` model: share of each hop's relation distribution taken from an order-free head (which
    relations the path uses, wherever they come), so the orders of the relations a question names all
    keep mass when the prior cannot tell which comes first. With the wording features
    (``wording_dim``) it can, and mixing costs accuracy (held-out top path a target on the 3-hop
    synthetic graph: 0.962 at 0, 0.916 at 0.5); set it for an order-blind prior (``wording_dim: 0``)."""
    neighbor_cap: int = 64
    """Golden-path search: at most this many neighbours of one node are followed (the sample of
    ``paths.sampled_slices`` beyond that), so a hub costs no more than the cap."""
    path_cap: int = 256
    """Golden-path search: at most this many end nodes are kept per query and relation path (the
    smallest ids), which bounds the frontier; hit and reach counts are taken on these."""
    batch_queries: int = 64
    """Golden-path search: queries searched together in one vectorised pass."""
    keep_ratio: float = 0.5
    """A relation path is a training target of its question when its F1 against the answers is at
    least this share of the question's best path's F1 (target weight proportional to F1)."""
    min_count: int = 2
    """Relation paths that are a target of fewer training questions are left out of the prior's vocabulary."""
    max_paths: int = 4096
    """The prior's vocabulary: at most this many relation paths, the most frequent targets first."""
    hidden_dim: int = 256
    """Hidden width of the prior's two-layer MLP (query features -> relation paths)."""
    refine_rounds: int = 1
    """Refits of the prior on its targets reweighted by its own probability of each path, which drops
    the paths that reach a question's answers by coincidence (``seeder.retrieve.prior.train_prior``);
    0 fits once."""
    question: PriorQuestion = "text"
    """What the prior reads of a question: ``text``, the embedding of the whole question (the features
    stage's); ``masked``, the embedding of the question with each seed's name replaced by its type
    (``seeder.retrieve.wording.masked_questions``), which says only how the question asks: a prior learnt
    from generated questions then reads real ones far better (``benchmarks/bench_prior_transfer.py``),
    for one more encoding of every question. ``auto`` (with no config file): ``masked`` when most
    training questions are generated, else ``text``."""
    path_text: bool = True
    """With ``question: masked``: also match the question against each vocabulary path written as a
    question from the relation and type texts ("which person wrote the movie directed by the person
    directed the movie"), by the encoder's cosine, with a weight chosen on the held-out training
    questions (``seeder.retrieve.path_text``). It reads how many relations a question names, which the
    per-hop softmaxes blur. Costs one encoding of every vocabulary path; skipped above ``PATH_TEXT_MAX`` paths."""
    answer_type: bool = True
    """With ``question: masked``: read the type of node each question asks for from its interrogative
    ("who", "when", or the word after "what" / "which", matched to the graph's type names by the encoder)
    and demote the paths that end at another type (``seeder.retrieve.answer_type``). The asked type is
    also an input of the prior's MLP. Costs one encoding of each distinct asking word."""
    local_match: bool = True
    """With ``question: masked``: also match the words either side of the question's seed against each
    path's first relation, and those either side of its asking word against the path's last, each
    relation written as a one-hop question ("which person directed the movie"), with two weights chosen
    on the held-out training questions (``seeder.retrieve.local_match``). It reads which relation comes
    first, which a sentence embedding blurs. Costs two short encodings per question."""
    vote: PriorVote = "off"
    """``labelled``: the training questions that are not generated (``seeder questions`` marks those) vote
    for their own target paths, each by how close its reading is to the new question's, and the prior's
    path probabilities are multiplied by (``vote_floor`` + the vote) (``seeder.retrieve.vote``). A few
    real questions then carry how users ask to the questions worded like them, which a prior fitted
    mostly on generated ones learns little of. ``auto`` (with no config file): ``labelled`` when most
    training questions are generated and some are not, else ``off``."""
    vote_temperature: float = 0.05
    """Width of the vote's kernel: a labelled question at cosine s to the new one votes with weight
    exp((s - 1) / vote_temperature), so only questions worded nearly alike count."""
    vote_floor: float = 0.01
    """Added to every path's vote before it multiplies the prior: where no labelled question is near,
    all votes are about the floor and the prior's ranking stands."""
    labelled_weight: float = 10.0
    """How much a training question that is not generated counts in the prior's fit, against 1 for a
    generated one: a hundred real questions among thousands of generated ones otherwise move the fit
    little. No effect when all training questions are of one kind."""
    wording_dim: int = 1024
    """Width of the hashed wording features the prior also reads: the question's words, word pairs and
    each word's distance to its seed's name, with the name masked (``seeder.retrieve.wording``). They
    say which relation comes at which hop, which a sentence embedding of the whole question blurs.
    0 reads the query embedding and the seeds' relations only."""
    epochs: int = 60
    """Most training epochs of the prior (it stops earlier when the held-out loss stops improving)."""
    patience: int = 5
    """Epochs without a better held-out loss before the prior's training stops."""
    lr: float = 2e-3
    """Adam learning rate of the prior."""
    weight_decay: float = 1e-4
    """Adam weight decay of the prior."""
    batch_size: int = 256
    """Training questions per step of the prior."""
    holdout_fraction: float = 0.1
    """Share of the training questions held out for early stopping and for choosing the text-match
    weights: real questions by a hash of the query id, generated ones by whole phrasings."""
    seed: int = 0
    """Seed of the prior's initialisation and batch order."""


@dataclass
class ModelConfig(Section):
    hidden_dim: int = 32
    """Width of the graph transformer."""
    num_layers: int = 3
    """Graph-transformer layers."""
    num_heads: int = 2
    """Attention heads per layer."""
    dropout: float = 0.1
    """Dropout in attention and feed-forward blocks."""
    query_injection: QueryInjection = "concat"
    """``add`` (z_v + W_q z_q) or ``concat`` ([z_v, W_q z_q, cos(z_v, z_q)] then a projection)."""
    step_relations: bool = False
    """Condition each edge's relation embedding on the rollout state of its source node (seed, added at
    step t, frontier) as well as on the query, so the model can tell which relation of a compositional
    question comes first ("the r2 of the r1 of X" against "the r1 of the r2 of X"): a bilinear query-relation
    match per source state. Off is the paper's model; it adds (MAX_STEPS + 2 + 1) x feature_dim x
    hidden_dim parameters."""
    path_end_residual: bool = True
    """Add w * path_end to every final score, with w learnt (starting at 1): the ranking starts from
    the relation-path prior's log mass ending at the node's path and the scoring head learns the
    corrections. No effect with the cosine filter, whose path_end is 0. Off is the paper's scoring head."""


@dataclass
class TrainConfig(Section):
    epochs: int = 15
    """Training epochs."""
    batch_size: int = 16
    """Queries per optimisation step (each with ``num_trajectories`` rollouts)."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-5
    """AdamW weight decay."""
    warmup_epochs: int = 3
    """Linear warm-up epochs before the cosine schedule."""
    grad_clip: float = 1.0
    """Gradient-norm clipping threshold."""
    num_trajectories: int = 8
    """M: trajectories sampled per query for group-centred REINFORCE (paper, Algorithm 2)."""
    temperature: float = 1.0
    """Gumbel-top-k sampling temperature."""
    expansion_sizes: list[int] = field(default_factory=lambda: [7, 10])
    """c_t: nodes added at each expansion step (its length is T, the number of steps)."""
    frontier_caps: list[int] = field(default_factory=lambda: [20, 50])
    """Frontier nodes considered at each step, best by filter score first."""
    bpr_weight: float = 1.0
    """lambda: weight of the BPR ranking loss."""
    bpr_margin: float = 0.0
    """gamma: margin of the BPR variant (paper uses 0.5); 0 is plain BPR."""
    seed: int = 0
    """Random seed of initialisation and sampling."""
    baseline: Baseline = "group_mean"
    """REINFORCE baseline: ``group_mean`` (centre on the query's M trajectories, the paper's default),
    ``none`` (ablation: raw rewards) or ``greedy`` (ablation: reward minus the greedy trajectory's).
    With ``num_trajectories=1`` use ``none`` or ``greedy``: a group of one has zero advantage."""
    mode: TrainMode = "seeder"
    """``seeder`` (learned expansion, Algorithm 2) or ``rerank`` (ablation: the GNN scores the whole
    K-hop subgraph, BPR only, no learned expansion)."""
    queries_per_epoch: int = 0
    """Training queries sampled (without replacement) per epoch; 0 uses them all."""
    init_from: str = ""
    """Start from the weights of this model (a model directory ``RUN/model``, ``runs:/ID/model`` or
    ``models:/NAME@ALIAS``) instead of a random
    initialisation; the optimizer and schedule start fresh (fine-tuning, or more epochs for a finished
    run). Its model section must match this config's."""
    skip_unanswerable: bool = True
    """Leave out of training the queries whose bounded subgraph holds no answer: their rewards are all
    zero and they have no BPR pair, so they only cost time."""
    eval_batch_size: int = 128
    """Queries per greedy evaluation batch."""
    val_queries: int = 0
    """Validation queries evaluated after each epoch (a fixed, seeded sample); 0 uses them all."""
    calibrate_path_end: bool = True
    """After each kept epoch, try the learnt path_end weight of the final score times 1, 2, 4 and 8 on
    the validation sample and keep the largest multiple whose MRR is within a standard error of the best
    one's (``seeder.training.calibration``): the scoring head's corrections, learnt mostly on generated
    questions, otherwise outvote the prior on real wording. No effect without validation queries or
    ``model.path_end_residual``."""
    delayed_allreduce: bool = False
    """Data-parallel runs (``pipelines/train.py --num-workers N``, N > 1): each step applies the average
    of the ranks' gradients of the step before (one-step-stale gradients; the first step applies none),
    so the all-reduce runs while the next step computes and a rank waits for a slower one only when it
    falls a whole step behind. False averages each step's own gradients, and every step waits for the
    slowest rank. Staleness interacts with the learning rate: on MetaQA (lr 1e-3, 32 questions per
    batch) validation stayed within the seeds' spread; on the demo's graph (lr 5e-3, batch 8) test Hit@1
    fell from 0.995 to 0.820. One worker, and the Ray-free trainer, are unaffected."""
    num_threads: int = 0
    """torch CPU threads of the Ray-free trainer (``python -m seeder.training.loop``); 0 keeps torch's default.
    On a shared, oversubscribed machine 1 can be many times faster than 2 (spinning OpenMP threads)."""


@dataclass
class EvalConfig(Section):
    ks: list[int] = field(default_factory=lambda: [1, 5, 20])
    """Cut-offs of Hit@k and Recall@k."""
    ranking_length: int = 100
    """Length of every full ranking a retriever returns."""
    expansion_sizes: list[int] = field(default_factory=list)
    """c_t when a trained model retrieves (Algorithm 1); empty uses the model's own
    ``train.expansion_sizes``. A larger inference budget than the training one trades set size for
    recall, as in the paper's budget curves."""
    frontier_caps: list[int] = field(default_factory=list)
    """Frontier caps when a trained model retrieves; empty uses the model's own ``train.frontier_caps``.
    Must have as many steps as the expansion sizes in use, each at least its step's size."""
    rollouts: int = 0
    """R: sampled rollouts per question next to the greedy one when a trained model retrieves (ARK's
    multi-rollout voting). Every question's 1 + R rollouts run in one batched pass, as training's
    trajectories do, at the model's ``train.temperature``; the retrieved set is the union of their
    sets, ranked by ``fusion``. 0 (the default) is greedy only: with R = 4 or 8 and reciprocal rank
    fusion, Hit@1 fell on MetaQA val and stayed equal on the synthetic 3-hop graph, while the policy's
    time per question grew 1.8-2.9x on MetaQA (benchmarks/RESULTS.md, "Multi-rollout voting (issue 48)")."""
    fusion: Fusion = "rrf"
    """How the rollouts' rankings are fused when ``rollouts`` > 0: ``rrf`` (reciprocal rank fusion,
    sum of 1 / (60 + rank)) or ``votes`` (how many rollouts selected a node, ties by reciprocal rank)."""
    rollout_seed: int = 0
    """Seed of the sampled rollouts' noise: a call ranks the same questions the same way every time."""
    prior_nodes: int = 5
    """After the policy's last expansion step, up to this many nodes of the bounded subgraph that end one
    of the relation-path prior's paths, the largest path end first, join the final set, which the scoring
    head then ranks (``seeder.policy.rollout``'s ``join_prior_ends``; training validates with it too). The
    learned expansion drops some answers the prior puts first, above all on three-hop questions worded
    unlike its training questions; 0 turns it off. Nothing joins with the cosine filter (no prior)."""


@dataclass
class EgoConfig(Section):
    """The bounded ego graph around the dense seeds that G-Retriever, SubgraphRAG and PPR read."""

    section = "baselines.ego"
    hops: int = 2
    """Hops of the bounded ego graph around the seeds."""
    neighbor_cap: int = 200
    """At most this many CSR entries of one node are followed (its first ones in CSR order), so a
    hub costs no more than this cap (beam and A* use it too)."""
    max_nodes: int = 1_000
    """At most this many nodes per ego graph, seeds first, then each hop's nodes by cosine."""


@dataclass
class GRetrieverConfig(Section):
    """G-Retriever: a prize-collecting Steiner tree over the ego graph (pcst_fast)."""

    section = "baselines.gretriever"
    topk_nodes: int = 3
    """Nodes given prizes k, k-1, ..., 1 by node-query similarity."""
    topk_edges: int = 5
    """Distinct edge-similarity values given prizes (the rest get 0)."""
    edge_cost: float = 0.5
    """Cost of every edge in the prize-collecting Steiner tree."""
    num_clusters: int = 1
    """Connected components returned by pcst_fast."""
    pruning: Pruning = "gw"
    """pcst_fast pruning."""
    prize_bonus: float = 0.1
    """Weight of a selected node's prize added to its cosine when ranking the selected nodes."""


@dataclass
class SubgraphRAGConfig(Section):
    """SubgraphRAG-style triple scoring over the ego graph."""

    section = "baselines.subgraphrag"
    weights: list[float] = field(default_factory=lambda: [1 / 3, 1 / 3, 1 / 3])
    """Weights of sim(q,head), sim(q,relation), sim(q,tail) in a triple's score."""
    top_triples: int = 100
    """Triples kept per query; their endpoints plus the seeds are retrieved."""


@dataclass
class BeamConfig(Section):
    """Beam traversal from the seeds (A* shares its transition score)."""

    section = "baselines.beam"
    width: int = 10
    """Paths kept per query after each hop."""
    hops: int = 2
    """Hops from the seeds."""
    weights: list[float] = field(default_factory=lambda: [1.0, 0.5, 1.0])
    """Weights of sim(q,destination), sim(q,relation) and the previous path score in a transition's
    score (A* uses the first two, with ``astar.discount`` for the third)."""
    hop_penalty: float = 0.1
    """Subtracted from the path score at every hop (prefers short paths); A* too."""


@dataclass
class AStarConfig(Section):
    """A*-style best-first search from the seeds."""

    section = "baselines.astar"
    budget: int = 50
    """States expanded per query."""
    depth: int = 3
    """The deepest hop that is expanded further."""
    heuristic_weight: float = 1.0
    """Weight of the node-query cosine heuristic added to the path score."""
    discount: float = 0.5
    """Weight of the parent's path score in a child's (replaces the beam's third weight). 1 sums
    transitions as classic A* does, which makes every deeper node look better and the search run
    depth-first; on 80 MetaQA 1-hop questions (hashed features) 1 gave Hit@20 0.11, 0.5 gave 0.55."""


@dataclass
class PPRConfig(Section):
    """Personalized PageRank from the seeds over the ego graph."""

    section = "baselines.ppr"
    restart: float = 0.15
    """Restart probability."""
    iterations: int = 20
    """Power iterations."""
    weight: float = 0.5
    """Weight of normalised PPR against dense cosine in the final relevance."""


@dataclass
class MMRConfig(Section):
    """PPR + maximal marginal relevance."""

    section = "baselines.mmr"
    pool: int = 250
    """Candidates (top by PPR relevance) the greedy selection draws from."""
    select: int = 20
    """Nodes chosen by maximal marginal relevance."""
    relevance: float = 0.78
    """lambda: the weight of relevance; 1 - lambda weighs redundancy (max cosine to the chosen)."""


@dataclass
class BM25Config(Section):
    """BM25 over node text (also the ``bm25`` and ``hybrid`` seed strategies)."""

    section = "baselines.bm25"
    k1: float = 1.5
    """Term-frequency saturation k1."""
    b: float = 0.75
    """Length normalisation b."""
    stopwords: str = "en"
    """Stopword list of the tokenizer (``en``, or empty for none)."""


@dataclass
class HybridConfig(Section):
    """BM25 and dense retrieval fused by reciprocal rank."""

    section = "baselines.hybrid"
    rrf_k: int = 60
    """Reciprocal rank fusion constant (score 1 / (rrf_k + rank))."""
    pool: int = 100
    """Candidates taken from each of BM25 and dense before fusion."""


@dataclass
class BaselinesConfig(Section):
    """The comparison suite of the paper's Table 1 (Appendix E) plus BM25 and hybrid retrieval, one
    sub-section per method."""

    seeds: int = 3
    """Dense seeds (top cosine) that the ego-graph, beam, A* and PPR baselines start from."""
    block_queries: int = 256
    """Queries processed together (ego graphs batched as one disjoint union)."""
    ego: EgoConfig = field(default_factory=EgoConfig)
    """The ego graph of G-Retriever, SubgraphRAG and PPR."""
    gretriever: GRetrieverConfig = field(default_factory=GRetrieverConfig)
    """G-Retriever (prize-collecting Steiner tree)."""
    subgraphrag: SubgraphRAGConfig = field(default_factory=SubgraphRAGConfig)
    """SubgraphRAG-style triple scoring."""
    beam: BeamConfig = field(default_factory=BeamConfig)
    """Beam traversal."""
    astar: AStarConfig = field(default_factory=AStarConfig)
    """A*-style best-first search."""
    ppr: PPRConfig = field(default_factory=PPRConfig)
    """Personalized PageRank."""
    mmr: MMRConfig = field(default_factory=MMRConfig)
    """PPR + maximal marginal relevance."""
    bm25: BM25Config = field(default_factory=BM25Config)
    """BM25 over node text."""
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    """BM25 + dense reciprocal rank fusion."""


FLAT_BASELINE_KEYS = {
    "ego_hops": ("ego", "hops"),
    "ego_neighbor_cap": ("ego", "neighbor_cap"),
    "ego_max_nodes": ("ego", "max_nodes"),
    "mmr_lambda": ("mmr", "relevance"),
    "rrf_k": ("hybrid", "rrf_k"),
    "hybrid_pool": ("hybrid", "pool"),
}
"""Configs written before the baselines had sub-sections (artifacts and models keep their config):
``baselines.<method>_<key>`` is read as ``baselines.<method>.<key>``; these are the irregular names."""


def _nest_flat_baselines(data: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    methods = ("gretriever", "subgraphrag", "beam", "astar", "ppr", "mmr", "bm25")
    for key, value in data.items():
        target = FLAT_BASELINE_KEYS.get(key) if isinstance(key, str) else None
        if target is None and isinstance(key, str):
            method = next((m for m in methods if key.startswith(m + "_")), None)
            target = (method, key[len(method) + 1 :]) if method else None
        if target is None:
            nested[key] = value
        else:
            nested.setdefault(target[0], {})[target[1]] = value
    return nested


@dataclass
class SynthConfig(Section):
    """The synthetic relation-tracing graph of ``seeder synth`` (paper, Definition B.1); the defaults are
    the small graph the demo runs end to end."""

    nodes: int = 2_000
    """N: nodes of the graph."""
    relations: int = 8
    """k: permutation relations (Definition B.1); each adds N edges."""
    max_path_length: int = 2
    """L: queries follow 1..L relations, uniformly."""
    queries: int = 6_000
    """Queries generated (start node and relation sequence uniform at random). Thousands are needed for
    the policy to learn which relation of a 2-hop question comes first (see configs/synth_default.yaml)."""
    hubs: int = 4
    """Hub nodes, each with ``hub_degree`` extra ``features`` edges (0 for none)."""
    hub_degree: int = 100
    """Extra out-edges of each hub (capped at N - 1)."""
    multi_answer_frac: float = 0.2
    """Share of queries whose last hop is the multi-valued ``associate of`` relation (0 for none)."""
    multi_answer_fanout: int = 3
    """c: permutations united into ``associate of``; a multi-answer query has up to c answers."""
    fanout_frac: float = 0.0
    """Share of queries whose every hop is ``associate of``: an l-hop one reaches up to c^l answers, and
    its path fans out at every hop (configs/synth_fanout.yaml)."""
    condition_frac: float = 0.0
    """Share of queries that end with ``associate of`` and name the answer's node type ("Which film is the
    associate of ..."): only the question's text against a candidate's text tells the answers from the
    other associates (configs/synth_condition.yaml)."""
    val_fraction: float = 0.1
    """Share of queries in the val split."""
    test_fraction: float = 0.1
    """Share of queries in the test split."""
    seed: int = 0
    """Seed of every random choice; the same seed gives the same bytes."""


@dataclass
class QuestionsConfig(Section):
    """Training questions generated from a graph's own paths and texts (``seeder questions``)."""

    count: int = 30_000
    """Questions wanted, an even share for each number of hops (fewer where the graph has too few
    distinct paths of a length within ``max_answers``)."""
    max_hops: int = 3
    """Relations per question: 1 to this many, uniformly."""
    max_answers: int = 50
    """A question whose path reaches more nodes than this is dropped (too broad to be a question)."""
    anchor_degree_cap: int = 100
    """Anchors are drawn in proportion to their degree, counted up to this cap, so that hubs do not
    take every question."""
    neighbor_cap: int = 1_000
    """At most this many neighbours of one node are followed when a path's answers are collected (a
    sample beyond it, K-HOP-WITH-FILTERING's: ``paths.sampled_slices``)."""
    holdout_fraction: float = 0.1
    """Share of the multi-hop relation paths never used for training questions, so that validation
    measures compositions the model has not seen."""
    real_train: int = 0
    """Real training questions of the dataset kept beside the generated ones (a fixed, hashed sample;
    0 keeps none: the generated questions alone train)."""
    source_val: bool = True
    """Keep the source's own val questions as the val split. False leaves them out: the questions over
    the held-out paths become the val split, so no real question chooses the kept epoch or the
    calibrated path_end weight (as on a graph without questions), and the source's test questions stay
    for the final measure."""
    seed: int = 0
    """Seed of every random choice; the same seed gives the same questions."""


@dataclass
class SeederConfig:
    """The whole configuration of a SeedER run, one section per stage."""

    embed: EmbedConfig = field(default_factory=EmbedConfig)
    """Text encoding of nodes, relations and queries."""
    reduce: ReduceConfig = field(default_factory=ReduceConfig)
    """PCA reduction of the embeddings."""
    seed: SeedConfig = field(default_factory=SeedConfig)
    """Seeding of each query."""
    expand: ExpandConfig = field(default_factory=ExpandConfig)
    """K-HOP-WITH-FILTERING: the bounded per-query subgraph."""
    prior: PriorConfig = field(default_factory=PriorConfig)
    """Golden relation paths and the learnt relation-path prior (``expand.relation_score: learned``)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The query-conditioned sparse graph transformer."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """REINFORCE + BPR training."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    """The synthetic graph generator (``seeder synth``); ignored by the other stages."""
    questions: QuestionsConfig = field(default_factory=QuestionsConfig)
    """Questions generated from a graph (``seeder questions``); ignored by the other stages."""
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    """The comparison suite: Table 1's baselines plus BM25 and hybrid."""


# ---------------------------------------------------------------------------------------------------
# Loading, overriding, documenting


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (PEP 257 attribute docstrings)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


INT_LIMIT = 2**63 - 1
"""Largest magnitude of an integer setting: every count and size ends up in an int64 (numpy, torch)."""


def _show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (a stray mapping can be large)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key(key: Any) -> str:
    """A key as written when it is printable, else its repr (so that an error stays on one line)."""
    key = str(key)
    return key if key.isprintable() else repr(key)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check and convert one value against its field's type; int -> float is allowed. NaN, infinities
    and integers beyond int64 are refused here, when the config is loaded, not deep inside a stage."""
    origin = get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {annotation.__name__} fields, got {_show(value)}")
        return from_dict(annotation, value, prefix=f"{key}.")
    if origin is list:
        (item_type,) = get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {_show(value)}")
        return [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if annotation in (int, float) and isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
        raise ConfigError(f"{key}={_show(value)}: out of range; numbers must lie within +-{INT_LIMIT} (int64)")
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            pass
    if annotation is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: not a finite number; give a finite value such as 0.001")
    if origin is Literal:
        if isinstance(value, bool):
            # YAML 1.1 reads a bare off / on / no / yes as a boolean: give back the choice so written.
            spelled = [c for c in get_args(annotation) if isinstance(c, str) and yaml.safe_load(c) is value]
            value = spelled[0] if len(spelled) == 1 else value
        return value  # the section checks the value (Section.__post_init__)
    if annotation in (int, float, str, bool):
        if not isinstance(value, annotation) or (annotation is int and isinstance(value, bool)):
            raise ConfigError(f"{key}: expected {annotation.__name__}, got {_show(value)}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) mapping; unknown keys are errors that list the known ones."""
    if cls is BaselinesConfig:
        data = _nest_flat_baselines(data)
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names), key=str)  # YAML keys may be numbers, dates, None...
    if unknown:
        raise ConfigError(f"unknown key {_key(prefix + str(unknown[0]))}; known keys here: {', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    return cls(**kwargs)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if any(not part.strip() for part in parts):
        raise ConfigError(
            f"override {_key(dotted) or repr(dotted)}=...: a dotted key needs a name between every dot "
            "(for example train.lr=3e-4)"
        )
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {_key(dotted)}: {_key(part)} is not a section")
    node[parts[-1]] = value


def yaml_problem(exc: Exception) -> str:
    """A YAML error on one line: ``line L, column C: problem`` (PyYAML's own message spans several lines,
    the last one a caret under the offending character)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if isinstance(exc, yaml.reader.ReaderError):
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else _show(exc.character)
        return f"character {exc.position + 1}: {char} is not allowed ({exc.reason})"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem or exc).split())


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=3e-4", "train.expansion_sizes=[5,5]"]`` -> nested dict of YAML-parsed values."""
    data: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {_show(item)} is not KEY=VALUE (for example train.lr=3e-4)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"override {_key(key.strip())}: value {_show(raw)} is not valid YAML "
                f"({yaml_problem(exc)}); quote it or fix it (lists are written [5,5])"
            ) from None
        except RecursionError:
            raise ConfigError(f"override {_key(key.strip())}: value nested too deeply") from None
        _set_dotted(data, key.strip(), value)
    return data


def with_overrides(config: "SeederConfig", overrides: list[str] | None) -> "SeederConfig":
    """``config`` with dotted ``overrides`` (``section.key=value``) applied, checked like a config file."""
    if not overrides:
        return config
    return from_dict(SeederConfig, _merge(to_dict(config), parse_overrides(overrides)))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


PREPROCESSING_SECTIONS = ("embed", "reduce", "seed", "expand", "prior")
"""Sections fixed by preprocessing: a run on existing artifacts always takes them from the artifacts."""


STEP_BUDGET_FIELDS = ("expansion_sizes", "frontier_caps")
"""The policy's step budget in the train section, which preprocessing may derive (seeder.preprocessing.derive)."""


def training_config(
    artifacts_config: "SeederConfig",
    config_path: str | Path | None,
    overrides: list[str] | None,
    step_budget: dict[str, list[int]] | None = None,
) -> "SeederConfig":
    """Model/train/eval settings from ``config_path`` + ``overrides``; the preprocessing sections always
    come from the artifacts' own config, since the subgraphs and features were built with them. A
    ``step_budget`` that preprocessing derived (``Artifacts.step_budget``) replaces the defaults of
    ``train.expansion_sizes`` and ``train.frontier_caps`` unless the config file or overrides set either."""
    given = user_config(config_path, overrides)
    merged = to_dict(load_config(config_path, overrides))
    base = to_dict(artifacts_config)
    for section in PREPROCESSING_SECTIONS:
        merged[section] = base[section]
    train_given = given.get("train") if isinstance(given.get("train"), dict) else {}
    if step_budget and not set(STEP_BUDGET_FIELDS) & set(train_given):
        merged["train"].update({name: list(step_budget[name]) for name in STEP_BUDGET_FIELDS})
    return from_dict(SeederConfig, merged)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> SeederConfig:
    """Defaults, then the YAML file at ``path`` (if any), then dotted ``overrides``."""
    data = user_config(path, overrides)
    try:
        return from_dict(SeederConfig, data)
    except ConfigError as exc:
        where = f" in {path}" if path is not None else ""
        raise ConfigError(f"{exc}{where}") from None


def user_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """What the user wrote, as a nested dict: the YAML file at ``path`` (if any), then dotted ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass a YAML file such as configs/metaqa.yaml")
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8-sig")
            loaded = yaml.safe_load(text) or {}
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(
                f"config file {path}: line {line} is not valid UTF-8 (byte {raw[exc.start : exc.start + 1]!r}); "
                "save the file as UTF-8"
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(exc)}") from None
        except RecursionError:
            raise ConfigError(f"config file {path}: nested too deeply to be a config") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(loaded).__name__}")
        data = loaded
    return _merge(data, parse_overrides(overrides or []))


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict (for YAML dumps, MLflow params and fingerprints)."""
    return dataclasses.asdict(config)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train.lr": 1e-3, ...}``: one entry per leaf field."""
    out: dict[str, Any] = {}
    for key, value in (to_dict(config) if dataclasses.is_dataclass(config) else config).items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def describe(cls: type = SeederConfig, prefix: str = "") -> list[str]:
    """One line per field: dotted key, default and its docstring (for ``seeder config``)."""
    lines: list[str] = []
    docs = field_docs(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            lines.extend(describe(type(value), f"{prefix}{f.name}."))
        else:
            lines.append(f"{prefix}{f.name} = {value!r}  # {docs.get(f.name, '')}")
    return lines
