"""A trained SeedER model as a retriever: load once, answer batches of new questions.

    from seeder import Retriever
    r = Retriever.load("models:/seeder-metaqa@champion")   # or runs:/ID/model, or RUN/model
    hits = r.retrieve(["what languages are the films directed by Joel Zwick in"], k=20)
    hits[0].nodes        # ranked ids, names, types, scores, the expansion step of each
    hits[0].triples      # edges among the retrieved nodes: (head, relation, tail) names
    hits[0].provenance   # where each triple came from: dataset version, edge row, input file and row
    hits[0].to_prompt()  # plain text for an LLM prompt

The model records the artifacts it was trained on (``seeder_model.json``), so the model alone is
enough. A new question goes through the same steps preprocessing took for the dataset's questions:
the artifacts' encoder and PCA, ``seeder.retrieve.seeds.seed_queries`` (entity linking with its name
index built once), K-HOP-WITH-FILTERING online (with the relation-path prior when the artifacts use
it), then greedy expansion and ranking (``seeder.policy.inference.retrieve``), all questions of a call in
batched passes. Preprocessed questions (``rank_split``) rank exactly as ``seeder evaluate`` ranks them.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seeder.config import SeederConfig
from seeder.data.provenance import EdgeIndex
from seeder.data.ragged import segment_ids
from seeder.data.store import REMOVED_TYPE
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.features.embed import PCA, apply_pca, is_gpu, load_encoder, runs_plain_torch
from seeder.preprocessing.artifacts import FingerprintMismatch, open_artifacts, warn_mismatch
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.prior import masked_reading
from seeder.retrieve.seeds import EntityLinker, seed_queries
from seeder.retrieve.wording import seed_names
from seeder.serving.explain import PriorTerms, expansion_paths
from seeder.system.io import DataError
from seeder.system.threads import intra_op_threads

ONE_THREAD_UP_TO = 8
"""Calls with at most this many questions run torch on one intra-op thread: their tensors are small
(one question: a 10-token MiniLM pass, a subgraph of ~120 nodes), and handing each op to a thread pool
costs more than it saves (a MetaQA question ranked 2.2x faster on one thread than on two, on 2 cores).
numpy's BLAS gets one thread too: its worker threads busy-wait after each product and take a core the
caller's other work (in a service, Ray Serve's proxy) needs. Calls of more questions keep every thread,
or are cut into parts of one thread each (``PART_QUESTIONS``). Measurements: benchmarks/RESULTS.md,
"Threads and parts of a Retriever call"."""


FILTERS_KEPT = 16
"""Node masks of this many recent filters are kept (one byte per node each)."""


PART_QUESTIONS = 32
"""On the CPU a call is answered in parts of at least this many questions, side by side, one thread
each (``Retriever._parts``), up to one part per torch thread: K-HOP-WITH-FILTERING is numpy on one core
whatever the thread settings, and the networks lose less to the GIL than to handing each small op to a
thread pool (on 16 cores about twice the questions/s of one call on 16 intra-op threads). A part is a
smaller batch, so a near-tie may rank the other way round, as with any other batch size."""


ENCODER_PRECISIONS = ("artifacts", "auto", "float32", "bfloat16", "int8")
"""How a Retriever encodes new questions on CPU: ``artifacts`` (the default) as preprocessing encoded the
dataset's (``embed.cpu_precision``), so a preprocessed question's text ranks as ``seeder evaluate``
ranks it; ``float32``; ``bfloat16``; ``int8`` (int8 GEMMs, see ``seeder.features.bert.int8_linear``); or
``auto``: bfloat16 where the CPU computes it natively and the encoder runs on the plain-torch backend,
else as the artifacts. bfloat16 encodes a question in about half float32's time, within cosine 0.9999;
int8 is never picked by ``auto``, as it moves more rankings (cosine ~0.997). Measurements:
benchmarks/RESULTS.md, "Threads and parts of a Retriever call"."""


def resolve_encoder_precision(choice: str, embed) -> str:
    """The CPU number format of ``choice`` (one of ``ENCODER_PRECISIONS``) for artifacts encoded with
    ``embed`` (their ``EmbedConfig``)."""
    from seeder.features import bert  # imports torch: only on this path

    if choice == "artifacts":
        return embed.cpu_precision
    if choice != "auto":
        return choice
    return "bfloat16" if runs_plain_torch(embed) and bert.native_bfloat16() else embed.cpu_precision


IN_MEMORY_FEATURES = 4 << 30
"""Node features up to this size (4 GiB: 4M nodes at 256 float32 dims) are held in memory by a Retriever."""


@dataclass
class RetrievedNode:
    rank: int
    id: int
    name: str
    type: str
    score: float
    step: int  # 0 seed, t + 1 added at expansion step t, -1 outside the retrieved set
    # From a seed to this node along the expansion (``seeder.serving.explain``): hops of
    # (from, relation, "forward" or "inverse", to), seed first; empty for a seed or outside the set.
    path: list[tuple[str, str, str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "id": self.id,
            "name": self.name,
            "type": self.type,
            "score": self.score,
            "step": self.step,
            "path": [list(hop) for hop in self.path],
        }

    def path_text(self) -> str:
        """The path as one line, e.g. ``Kismet -directed_by-> William Dieterle <-directed_by- The Story``."""
        if not self.path:
            return self.name
        text = self.path[0][0]
        for _, relation, direction, to in self.path:
            text += f" -{relation}-> {to}" if direction == "forward" else f" <-{relation}- {to}"
        return text


@dataclass
class Hits:
    """One question's answer: its ranked nodes and the triples among them."""

    question: str
    nodes: list[RetrievedNode]
    triples: list[tuple[str, str, str]] = field(default_factory=list)
    set_size: int = 0  # nodes in the policy's final set (the first ``set_size`` ranks)
    dataset: str = ""  # fingerprint of the dataset version that answered (``Retriever.reload`` switches it)
    # One per triple, in the same order (``seeder.data.provenance``): the dataset version, the edge's row
    # and, where the import kept them, the input file, its row and the RDF IRIs.
    provenance: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "dataset": self.dataset,
            "set_size": self.set_size,
            "nodes": [n.to_dict() for n in self.nodes],
            "triples": [list(t) for t in self.triples],
            "provenance": self.provenance,
        }

    def to_prompt(self, max_triples: int = 50, paths: bool = False) -> str:
        """The retrieved subgraph as plain text for an LLM prompt: the question, the nodes best first
        (with ``paths``, each with the path that joins it to a seed), then the triples among them."""
        lines = [f"Question: {self.question}", "", "Retrieved entities (best first):"]
        for n in self.nodes:
            lines.append(f"{n.rank}. {n.name} ({n.type})" if n.type else f"{n.rank}. {n.name}")
            if paths and n.path:
                lines.append(f"   via {n.path_text()}")
        if self.triples:
            lines += ["", "Facts among them (head | relation | tail):"]
            lines += [f"{h} | {r} | {t}" for h, r, t in self.triples[:max_triples]]
        return "\n".join(lines)


class Retriever:
    """A loaded model, its artifacts and everything a question needs, built once."""

    def __init__(
        self,
        model,
        info,
        artifacts,
        device: str = "cpu",
        config: SeederConfig | None = None,
        encoder_precision: str = "artifacts",
        compiled: bool = False,
        zero_shot: bool = False,
    ):
        from seeder.policy.inference import Schedule  # imports torch: only on this path

        if encoder_precision not in ENCODER_PRECISIONS:
            raise DataError(f"encoder_precision={encoder_precision!r}: use one of {', '.join(ENCODER_PRECISIONS)}")
        self.info = info
        self.artifacts = artifacts
        self.config = config or artifacts.config  # preprocessing and eval settings of the artifacts
        self.device = device
        self.encoder_precision = encoder_precision
        self.model = model.to(device)
        if compiled:
            from seeder.serving.compiled import compile_policy  # imports torch: only on this path

            compile_policy(self.model, release_gil=not self.on_gpu)  # on the CPU a call's parts run side by side
        self.compiled = compiled
        self.zero_shot = zero_shot  # a model trained on another graph (``check_compatible``)
        model_config = info.config
        if zero_shot and artifacts.step_budget and not self.config.eval.expansion_sizes:
            # Carried to another graph, the policy takes the steps that graph's questions need (seeder.preprocessing.derive).
            model_config = replace(info.config, train=replace(info.config.train, **artifacts.step_budget))
        self.schedule = Schedule.evaluation(self.config, model_config)
        self.ranking_length = max(self.config.eval.ranking_length, self.schedule.budget)
        self.batch_size = info.config.train.eval_batch_size
        self._part_threads, self._part_workers = None, 0  # a call's parts' ThreadPoolExecutor and its size
        self.source = "the model"  # what it was loaded from, for messages (``load`` sets it)
        self._filters: dict[tuple, np.ndarray] = {}  # node masks of recent filters (``node_filter``)

    # -- loading -----------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        model: str | Path,
        artifacts: str | Path | None = None,
        device: str = "cpu",
        config: SeederConfig | None = None,
        accept_mismatch: bool = False,
        encoder_precision: str = "artifacts",
        compiled: bool = False,
    ) -> "Retriever":
        """``model``: a model directory, ``runs:/ID/model`` or ``models:/NAME@ALIAS``. ``artifacts``
        defaults to the ones the model was trained on; other artifacts must come from the same dataset
        with the same features (embed and reduce), and artifacts must match the dataset they were built
        from, or loading fails naming both fingerprints. ``accept_mismatch=True`` turns those errors
        into warnings (a feature width that differs stays an error: the model cannot run on it).
        ``encoder_precision`` (see ``ENCODER_PRECISIONS``) sets the number format of new questions'
        encoding on CPU. ``compiled=True`` runs the policy and the question encoder through
        ``torch.compile`` (``seeder.serving.compiled``: faster answers after 20-30 s of compiling on the first
        questions; needs a C++ compiler)."""
        from seeder.policy.checkpoint import load_model, locate  # imports torch: only on this path

        policy, info = load_model(locate(model))
        where = artifacts or info.artifacts.get("path")
        if not where:
            raise DataError(f"model {model} does not record its artifacts; pass artifacts=... (--artifacts)")
        opened = open_artifacts(where, accept_mismatch=accept_mismatch)
        zero_shot = check_compatible(info, opened, str(model), accept_mismatch=accept_mismatch)
        retriever = cls(
            policy,
            info,
            opened,
            device=device,
            config=config,
            encoder_precision=encoder_precision,
            compiled=compiled,
            zero_shot=zero_shot,
        )
        retriever.source = str(model)
        return retriever

    def reload(self, artifacts: str | Path, accept_mismatch: bool = False) -> "Retriever":
        """This model over other artifacts, such as those of an updated version of its graph
        (``seeder import ... --update``), without retraining: a new ``Retriever`` sharing the policy, and
        the question encoder when the encoder settings agree. This one keeps answering from its own
        artifacts, so a call in flight finishes on the version it started with; switch by replacing the
        reference (``retriever = retriever.reload(new)``), after ``warm_up`` for a first call without
        index building. The new artifacts must share the model's features: the same version, an update
        built in the encoder's feature space (``reduce.dim: 0``), or another graph in it (zero-shot), as
        ``check_compatible`` decides; ``accept_mismatch`` as in ``load``. Artifacts whose preprocessing has
        not finished are refused (``Artifacts.check_finished``)."""
        opened = open_artifacts(artifacts, accept_mismatch=accept_mismatch)
        opened.check_finished()
        zero_shot = check_compatible(self.info, opened, self.source, accept_mismatch=accept_mismatch)
        new = Retriever(
            self.model,  # already on the device, and compiled in place when this one is
            self.info,
            opened,
            device=self.device,
            encoder_precision=self.encoder_precision,
            zero_shot=zero_shot,
        )
        new.compiled, new.source = self.compiled, self.source
        if "encoder" in self.__dict__ and opened.config.embed == self.config.embed:
            new.__dict__["encoder"] = self.encoder  # built once: loading MiniLM takes seconds
        return new

    @property
    def dataset_version(self) -> str:
        """Fingerprint of the dataset version this retriever answers from (also in every ``Hits``)."""
        return str(self.artifacts.manifest.get("dataset_fingerprint", ""))

    # -- the pieces a new question needs, built on first use ------------------------------------------

    @cached_property
    def encoder(self):
        cpu_precision = resolve_encoder_precision(self.encoder_precision, self.config.embed)
        encoder = load_encoder(replace(self.config.embed, cpu_precision=cpu_precision), device=self.device)
        if self.compiled:
            from seeder.serving.compiled import compile_encoder  # imports torch: only on this path

            compile_encoder(encoder, release_gil=not self.on_gpu)
        return encoder

    @property
    def on_gpu(self) -> bool:
        return is_gpu(self.device)

    @property
    def query_precision(self) -> str:
        """The number format new questions are encoded in: on the CPU ``encoder_precision`` resolved; on a
        GPU the encoder's own, float16 unless ``embed.half_precision`` is off (``encoder_precision``
        chooses among CPU formats only)."""
        if self.on_gpu:
            return "float16" if self.config.embed.half_precision else "float32"
        return resolve_encoder_precision(self.encoder_precision, self.config.embed)

    @cached_property
    def pca(self):
        path = Path(self.artifacts.path) / "features" / "pca.npz"
        return PCA.load(path) if path.is_file() else None

    @cached_property
    def linker(self):
        return EntityLinker(self.artifacts.dataset, self.config.seed)

    @cached_property
    def graph(self):
        from seeder.retrieve.khop import GraphIndex  # numba: the K-hop kernels load with the first question

        return GraphIndex.build(self.artifacts.dataset)

    @cached_property
    def prior(self):
        if self.config.expand.relation_score != "learned":
            return None
        return self.artifacts.prior()

    @cached_property
    def node_features(self) -> np.ndarray:
        """The artifacts' node features, read into memory when they fit in ``IN_MEMORY_FEATURES`` bytes:
        a memmap pays Python-level overhead on each of the ~20 slices a question takes (0.5 ms), and a
        service reads them all anyway. Larger ones stay memory-mapped."""
        features = self.artifacts.node_features
        return np.array(features) if features.nbytes <= IN_MEMORY_FEATURES else features

    @cached_property
    def filter_features(self) -> np.ndarray:
        """The node rows K-HOP's filter reads, as preprocessing read them: ``node_features``, or the
        artifacts' bfloat16 copy on a large graph (``seeder.features.bfloat16``)."""
        features = self.artifacts.filter_features
        return self.node_features if features.dtype == self.node_features.dtype else features

    @cached_property
    def live_nodes(self) -> np.ndarray | None:
        """False for the placeholders of nodes an update removed, or None when there are none."""
        removed = pc.fill_null(pc.equal(self.artifacts.dataset.nodes.column("type"), REMOVED_TYPE), False)
        removed = removed.to_numpy(zero_copy_only=False)
        return ~removed if removed.any() else None

    @cached_property
    def edge_index(self) -> EdgeIndex:
        return EdgeIndex(self.artifacts.dataset)

    @cached_property
    def node_table(self):
        nodes = self.artifacts.dataset.nodes
        return nodes.column("name").to_pylist(), nodes.column("type").to_pylist()

    # -- questions -> subgraphs -> rankings -------------------------------------------------------------

    def encode(self, questions: list[str]) -> np.ndarray:
        """[Q, d] features of new questions: the artifacts' encoder and PCA."""
        if not questions or any(not isinstance(q, str) or not q.strip() for q in questions):
            raise DataError("every question must be a non-empty string")
        return np.asarray(apply_pca(self.encoder.encode(list(questions)), self.pca), dtype=np.float32)

    def subgraphs(self, questions: list[str], topics: list[int | None] | None = None) -> tuple[SubgraphSet, np.ndarray]:
        """Embed, seed and expand new questions exactly as preprocessing did for the dataset's."""
        subgraphs, query_features, _ = self._expand(questions, topics)
        return subgraphs, query_features

    def _expand(
        self, questions: list[str], topics: list[int | None] | None = None
    ) -> tuple[SubgraphSet, np.ndarray, PriorTerms | None]:
        """``subgraphs``, and the relation-path prior's terms of the questions (None without a prior),
        computed once: the expansion scores with them and the explanation chooses paths by them."""
        query_features = self.encode(questions)
        given = None
        if self.config.seed.strategy == "given":
            given = [
                np.array([t], np.int64) if t is not None else np.zeros(0, np.int64) for t in (topics or [None] * len(questions))
            ]
        seeds, scores = seed_queries(
            self.artifacts.dataset,
            self.config,
            query_features,
            self.node_features,
            texts=list(questions),
            linker=self.linker if self.config.seed.strategy in ("entity", "dense+entity") else None,
            given=given,
        )
        n = len(questions)
        from seeder.retrieve.khop import expand_queries, prior_path_terms  # numba: the K-hop kernels load with the first question

        terms = None
        if self.prior is not None:
            prior_reads = query_features
            if self.prior.question == "masked":  # more encodings: the masked question, its asking word and windows
                prior_reads, _ = masked_reading(
                    list(questions),
                    seed_names(self.artifacts.dataset.node_names, seeds),
                    seed_names(self.artifacts.dataset.node_types, seeds),
                    self.encode,
                    self.encoder.encode,
                    None if self.prior.answer_types is None else self.prior.answer_types.names,
                    self.prior.local_match is not None,
                )
            terms = prior_path_terms(
                self.artifacts.dataset, self.graph, self.prior, np.asarray(prior_reads, np.float32), seeds, list(questions)
            )
        subgraphs = expand_queries(
            self.artifacts.dataset,
            self.filter_features,
            self.artifacts.relation_features,
            query_features,
            seeds,
            scores,
            self.config.expand,
            np.arange(n, dtype=np.int64),
            np.array(["new"] * n, dtype=object),
            np.zeros(n + 1, np.int64),
            np.zeros(0, np.int64),
            graph=self.graph,
            prior=self.prior,
            texts=list(questions),
            path_terms=terms,
        )
        return subgraphs, query_features, None if terms is None else PriorTerms(*terms, self.prior.trie.children)

    def rank(
        self, subgraphs: SubgraphSet, query_features: np.ndarray, progress: str | None = None
    ) -> tuple[RetrievalResult, np.ndarray, np.ndarray]:
        """Rankings of bounded subgraphs: (result, step per ranked node, score per ranked node);
        ``progress`` names a progress display over the questions."""
        from seeder.policy.inference import QueryData, retrieve  # imports torch: only on this path

        data = QueryData(
            self.node_features,
            np.asarray(self.artifacts.relation_features, np.float32),
            np.asarray(query_features, np.float32),
            subgraphs,
        )
        return retrieve(self.model, data, self.schedule, self.ranking_length, self.batch_size, progress)

    def rank_split(self, split: str) -> tuple[RetrievalResult, SubgraphSet]:
        """The preprocessed questions of ``split``, ranked as ``seeder evaluate`` ranks them."""
        subgraphs = self.artifacts.subgraphs(split)
        rows = self.artifacts.query_rows(subgraphs.query_ids)
        result, _, _ = self.rank(subgraphs, np.asarray(self.artifacts.query_features[rows], np.float32))
        return result, subgraphs

    def warm_up(self) -> None:
        """Build what the first question would (the encoder, the name and graph indexes) and, for a
        compiled retriever, compile every graph a call can need: one question and a few (on one
        thread, ``ONE_THREAD_UP_TO``), a call of one part on every thread, and a batch longer than the
        encoder's (on the CPU cut into parts of one thread each, ``PART_QUESTIONS``). On a GPU the
        batches run too: the first batch there paid about 0.8 s of one-time library set-up (seen on an
        H200)."""
        texts = ["who directed the film", "which films did the director of that film write"]
        self.retrieve(texts[:1], k=1)
        if self.compiled or self.on_gpu:
            self.retrieve(texts, k=1)
            for size in (ONE_THREAD_UP_TO + 1, max(2 * PART_QUESTIONS, int(getattr(self.encoder, "batch_size", 0))) + 1):
                self.retrieve((texts * size)[:size], k=1)

    def retrieve(
        self,
        questions: list[str] | str,
        k: int | list[int] = 20,
        topics: list[int | None] | None = None,
        types: list[str] | None = None,
        where: dict[str, Any] | None = None,
    ) -> list[Hits]:
        """The top ``k`` nodes of each question and the triples among them; ``k`` may be one value per
        question (a service ranks the questions of several requests in one pass).

        ``types`` and ``where`` filter the ranked output, not the expansion: only nodes of one of
        ``types``, and whose node-table columns hold the values of ``where`` (``{"column": value}``, or a
        list of accepted values), are shown, ranked 1, 2, ... in their original order; the policy expands
        and ranks exactly as without them."""
        if isinstance(questions, str):
            questions = [questions]
        questions = list(questions)
        ks = [k] * len(questions) if isinstance(k, int) else list(k)
        if len(ks) != len(questions):
            raise DataError(f"{len(ks)} values of k for {len(questions)} questions")
        keep = self.node_filter(types, where)
        parts = self._parts(len(questions))
        if parts > 1:
            self._build_indexes()  # once, here: the parts would otherwise race to build them
        # A part runs one intra-op thread, as does a call of a few questions; a call of one part keeps
        # every thread. Graphs compile per thread count, so there are two: one and all.
        with intra_op_threads(1 if parts > 1 or len(questions) <= ONE_THREAD_UP_TO else None):
            if parts == 1:
                return self._answer(questions, ks, topics, keep)
            bounds = np.linspace(0, len(questions), parts + 1).astype(int).tolist()
            futures = [
                self._pool(parts).submit(self._answer, questions[lo:hi], ks[lo:hi], topics[lo:hi] if topics else None, keep)
                for lo, hi in zip(bounds[:-1], bounds[1:])
            ]
            return [hits for future in futures for hits in future.result()]

    def _answer(self, questions: list[str], ks: list[int], topics: list[int | None] | None, keep=None) -> list[Hits]:
        subgraphs, query_features, prior_terms = self._expand(questions, topics)
        result, steps, scores = self.rank(subgraphs, query_features)
        return self._hits(questions, subgraphs, result, steps, scores, ks, keep, query_features, prior_terms)

    def node_filter(self, types: list[str] | None = None, where: dict[str, Any] | None = None) -> np.ndarray | None:
        """Which nodes a filtered call shows (bool per node), or None without a filter. Built once per
        filter and kept (``FILTERS_KEPT`` of them): a call then pays one gather over its rankings. Nodes
        an update removed (``seeder.data.update``: they keep their ids as placeholders) are never shown."""
        if not types and not where:
            return self.live_nodes
        key = (tuple(sorted(types or ())), tuple(sorted((c, str(v)) for c, v in (where or {}).items())))
        if key not in self._filters:
            nodes = self.artifacts.dataset.nodes
            keep = np.ones(nodes.num_rows, dtype=bool) if self.live_nodes is None else self.live_nodes.copy()
            for column, wanted in ([("type", list(types))] if types else []) + list((where or {}).items()):
                if column not in nodes.column_names:
                    raise DataError(
                        f"filter on {column!r}: the nodes have no such column (columns: {', '.join(nodes.column_names)})"
                    )
                values = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
                hit = pc.is_in(nodes.column(column), value_set=pa.array(list(values), nodes.schema.field(column).type))
                keep &= hit.to_numpy(zero_copy_only=False).astype(bool)
            if not keep.any():
                known = sorted(set(nodes.column("type").to_pylist()))[:10]
                raise DataError(
                    f"filter types={types} where={where}: no node matches (node types include {', '.join(map(str, known))})"
                )
            if len(self._filters) >= FILTERS_KEPT:
                self._filters.pop(next(iter(self._filters)))
            self._filters[key] = keep
        return self._filters[key]

    def _parts(self, count: int) -> int:
        """How many parts a call of ``count`` questions is cut into on the CPU, each answered on its own
        thread with torch and BLAS on one thread: one per ``PART_QUESTIONS`` questions, at most one per
        torch intra-op thread of the caller. On a GPU a call is one part."""
        import torch  # torch only on this path

        if self.on_gpu:
            return 1
        return max(1, min(torch.get_num_threads(), count // PART_QUESTIONS))

    def _pool(self, workers: int):
        if self._part_workers < workers:
            self._part_threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seeder-retrieve")
            self._part_workers = workers
        return self._part_threads

    def _build_indexes(self) -> None:
        """Everything a question needs that is built on first use."""
        _ = (
            self.encoder,
            self.pca,
            self.node_features,
            self.filter_features,
            self.graph,
            self.prior,
            self.node_table,
            self.live_nodes,
        )
        if self.config.seed.strategy in ("entity", "dense+entity"):
            _ = self.linker

    def retrieve_frame(self, questions: list[str], k: int = 20):
        """One row per (question, rank): question, rank, node, name, score, step (pandas)."""
        import pandas as pd  # pandas only for this table

        rows = [
            {"question": h.question, "rank": n.rank, "node": n.id, "name": n.name, "score": n.score, "step": n.step}
            for h in self.retrieve(questions, k=k)
            for n in h.nodes
        ]
        return pd.DataFrame(rows, columns=["question", "rank", "node", "name", "score", "step"])

    def _hits(
        self,
        questions,
        subgraphs: SubgraphSet,
        result: RetrievalResult,
        steps,
        scores,
        ks: list[int],
        keep=None,
        query_features: np.ndarray | None = None,
        prior_terms: PriorTerms | None = None,
    ) -> list[Hits]:
        names, types = self.node_table
        relation_names = self.artifacts.dataset.relation_names
        version = self.dataset_version
        # The top k_i ranks of each question, as flat (question, rank) pairs.
        valid = result.ranking >= 0
        set_size = result.set_size
        if keep is not None:  # a filtered call: the kept nodes, numbered 1, 2, ... in their ranking's order
            valid &= keep[np.maximum(result.ranking, 0)]
            set_size = (valid & (np.arange(valid.shape[1]) < result.set_size[:, None])).sum(axis=1)
        position = np.cumsum(valid, axis=1)  # a shown node's rank
        shown = valid & (position <= np.asarray(ks, dtype=np.int64)[:, None])
        question, rank = np.nonzero(shown)
        ids = result.ranking[question, rank]
        triple_ptr, heads, relations, tails = retrieved_triples(subgraphs, question, rank, ids)
        fit = None
        if query_features is not None:  # each relation's fit to each question, to choose among parent edges
            relation_features = np.asarray(self.artifacts.relation_features, np.float32)
            fit = unit_rows(np.asarray(query_features, np.float32)) @ unit_rows(relation_features).T
        hops = expansion_paths(subgraphs, result.ranking, steps, fit, prior_terms)
        hop_from, hop_rel, hop_along, hop_to = (a[question, rank] for a in hops)
        paths = [
            [
                (str(names[f]), str(relation_names[r]), "forward" if forward else "inverse", str(names[t]))
                for f, r, forward, t in zip(fr, rr, al, to)
                if f >= 0
            ]
            for fr, rr, al, to in zip(hop_from.tolist(), hop_rel.tolist(), hop_along.tolist(), hop_to.tolist())
        ]
        triples = [
            (str(names[h]), str(relation_names[r]), str(names[t]))
            for h, r, t in zip(heads.tolist(), relations.tolist(), tails.tolist())
        ]
        provenance = self.edge_index.sources(heads, relations, tails)
        node_ptr = np.searchsorted(question, np.arange(len(questions) + 1))
        nodes = [
            RetrievedNode(rank=r, id=node, name=str(names[node]), type=str(types[node] or ""), score=score, step=step, path=path)
            for r, node, score, step, path in zip(
                position[question, rank].tolist(),
                ids.tolist(),
                scores[question, rank].tolist(),
                steps[question, rank].tolist(),
                paths,
            )
        ]
        return [
            Hits(
                question=text,
                nodes=nodes[node_ptr[i] : node_ptr[i + 1]],
                triples=triples[triple_ptr[i] : triple_ptr[i + 1]],
                provenance=provenance[triple_ptr[i] : triple_ptr[i + 1]],
                set_size=int(set_size[i]),
                dataset=version,
            )
            for i, text in enumerate(questions)
        ]


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def retrieved_triples(
    subgraphs: SubgraphSet, question: np.ndarray, rank: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The graph's edges among each question's retrieved nodes (its subgraph's induced edges), for every
    question at once: (ptr [Q + 1] into the triples, head ids, base relations, tail ids), each question's
    triples in rank order of (head, tail). ``question``, ``rank`` and ``ids`` are the retrieved
    (question, rank, node) triples, sorted by question."""
    num_q = len(subgraphs)
    n = int(max(subgraphs.nodes.max(initial=-1), ids.max(initial=-1))) + 1
    keys = question * n + ids
    by_key = np.argsort(keys, kind="stable")
    found, pos = sorted_lookup(keys[by_key], segment_ids(subgraphs.node_ptr) * n + subgraphs.nodes)
    rank_of = np.where(found, rank[by_key[pos]] if len(keys) else -1, -1)  # per subgraph node; -1 not retrieved
    edge_query = segment_ids(subgraphs.edge_ptr)
    src = subgraphs.node_ptr[edge_query] + subgraphs.edge_src
    dst = subgraphs.node_ptr[edge_query] + subgraphs.edge_dst
    inside = np.flatnonzero((rank_of[src] >= 0) & (rank_of[dst] >= 0))
    order = inside[np.lexsort((rank_of[dst[inside]], rank_of[src[inside]], edge_query[inside]))]
    ptr = np.searchsorted(edge_query[order], np.arange(num_q + 1))
    return ptr, subgraphs.nodes[src[order]], subgraphs.edge_rel[order], subgraphs.nodes[dst[order]]


def check_compatible(info, artifacts, model: str, accept_mismatch: bool = False) -> bool:
    """A model only runs on artifacts with its features: same width, and when the model recorded them,
    the same dataset and feature-stage fingerprints (same graph, encoder and PCA). A fingerprint that
    differs is an error naming both, or a warning with ``accept_mismatch``. The exception is a model
    carried to another graph in the same feature space (the encoder's own, ``reduce.dim: 0`` on both):
    it runs zero-shot, says so on stderr, and this returns True. Relations are read through their texts'
    embeddings, so the other graph's relation ids do not matter. An updated version of the model's graph
    (``seeder.data.update``: its lineage holds the model's dataset) in the same shared space is at home:
    ids are stable, so it says so on stderr and this returns False. So does one whose artifacts were
    preprocessed from the model's by ``pipelines/preprocess.py --update`` (their PCA kept), at any distance."""
    from seeder.policy.checkpoint import artifact_feature_space  # imports torch: only on this path

    dim = int(artifacts.node_features.shape[1])
    if info.feature_dim != dim:
        raise DataError(
            f"model {model} was trained on {info.feature_dim}-dim features but {artifacts.path} has {dim}; "
            "use artifacts built with the same embed/reduce settings"
        )
    record = info.artifacts or {}
    trained_features = (record.get("fingerprints") or {}).get("features")
    lineage = ((artifacts.manifest.get("update") or {}).get("parent") or {}).get("features_lineage") or []
    if trained_features and trained_features in lineage:
        print(
            f"update: model {model} was trained on an earlier version of this graph ({record.get('path', '?')}); "
            f"it ranks {artifacts.path}, preprocessed from those artifacts with their PCA (--update)",
            file=sys.stderr,
        )
        return False
    space = record.get("feature_space")
    here = artifacts.manifest.get("dataset_fingerprint")
    known = record.get("dataset_fingerprints") or [record.get("dataset_fingerprint")]  # several with multi-graph training
    if space and space == artifact_feature_space(artifacts) and here:
        if here not in known and set(known) & set(artifacts.dataset.lineage):
            print(
                f"update: model {model} was trained on an earlier version of this graph ({record.get('path', '?')}); "
                f"it ranks {artifacts.path}, built in the same feature space",
                file=sys.stderr,
            )
            return False
        if here not in known:
            graphs = record.get("paths") or [record.get("path", "?")]
            print(
                f"zero-shot: model {model} was trained on {'other graphs' if len(graphs) > 1 else 'another graph'} "
                f"({', '.join(graphs)}); "
                f"it ranks {artifacts.path} through the encoder's shared feature space and the relations' texts",
                file=sys.stderr,
            )
            return True
        if here != record.get("dataset_fingerprint"):
            return False  # one of the other graphs it was trained on
    stages = artifacts.manifest.get("fingerprints") or {}
    differ = []
    trained, current = record.get("dataset_fingerprint"), artifacts.manifest.get("dataset_fingerprint")
    if trained and current and trained != current:
        differ.append(f"dataset fingerprint {trained} != {current}")
    trained, current = (record.get("fingerprints") or {}).get("features"), stages.get("features")
    if trained and current and trained != current:
        differ.append(f"features fingerprint {trained} != {current}")
    if not differ:
        return False
    message = (
        f"model {model} was trained on artifacts {record.get('path')} (fingerprint {record.get('fingerprint', '?')}), "
        f"but {artifacts.path} has fingerprint {artifacts.fingerprint or '?'}: {', '.join(differ)} (another graph, "
        f"encoder or PCA); use the artifacts it was trained on, retrain, build both with reduce.dim=0 and the "
        f"same encoder to carry the model to another graph or an updated version of its graph, or pass --accept-mismatch "
        f"(accept_mismatch=True) to run it anyway"
    )
    if not accept_mismatch:
        raise FingerprintMismatch(message)
    warn_mismatch(message)
    return False


# -- the `seeder retrieve` command ----------------------------------------------------------------------
