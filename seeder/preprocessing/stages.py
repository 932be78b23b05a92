"""Preprocessing stages without Ray: fingerprints, resumable stage directories, shard bookkeeping,
the per-block work of each stage and the run summary. ``pipelines/preprocess.py`` distributes the
work with Ray and calls these.

Stages and what each one's fingerprint covers (a rerun skips a stage whose manifest carries the same
fingerprint, so a changed input or config section reruns that stage and everything downstream)::

    embed      dataset content + embed section (encoder identity, not its batch size or actor count)
    features   embed fingerprint + reduce section
    seeds      features fingerprint + seed section (not its block sizes; ANN settings only where the index
               is used: seed_search_key)
    paths      seeds fingerprint + expand.hops + prior search caps   (only with expand.relation_score: learned)
    prior      paths fingerprint + prior fit settings                 (only with expand.relation_score: learned)
    subgraphs  seeds and features fingerprints + expand section (+ prior fingerprint when learned)

Resumability: a stage works inside ``ARTIFACTS/.STAGE.partial/``, keyed by its fingerprint and shard
layout. Shards have deterministic names per block and are written to a temporary file that is
renamed into place, so after a kill every shard present is whole; a rerun keeps them and computes
only the missing blocks. The stage manifest is written last and the directory is then renamed to
``ARTIFACTS/STAGE/``: an interrupted stage never looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seeder.config import ConfigError, SeederConfig, from_dict, to_dict
from seeder.data.store import KnowledgeGraph, open_dataset
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.features import bfloat16
from seeder.features.embed import PCA, apply_pca, check_encoder, embed_key, fit_pca, l2_normalize, load_encoder, pca_sample_rows
from seeder.preprocessing.artifacts import prior_question_rows, read_seed_table
from seeder.retrieve.ann import AnnIndex, check_ann_config, sample_recall
from seeder.retrieve.answer_type import AnswerTypes, asked_words, type_names
from seeder.retrieve.khop import GraphIndex, expand_queries
from seeder.retrieve.local_match import LocalMatch, choose_weights
from seeder.retrieve.metrics import ceiling_values, group_by, group_means
from seeder.retrieve.path_text import PATH_TEXT_MAX, PathText, choose_weight, relation_tail_types, render_paths
from seeder.retrieve.paths import GOLDEN_SCHEMA, ROOT, describe, golden_paths_batched
from seeder.retrieve.prior import (
    RelationPathPrior,
    held_out_questions,
    masked_reading,
    path_targets,
    prior_inputs,
    seed_relation_profile,
    train_prior,
)
from seeder.retrieve.seeds import dense_search, resolve_search, seed_queries
from seeder.retrieve.vote import LabelledVote
from seeder.retrieve.wording import WORDING_VERSION, question_form, seed_names
from seeder.system import storage
from seeder.system.io import (
    DataError,
    checksum_matches,
    file_records,
    fingerprint_json,
    now,
    read_manifest,
    verify_outputs,
    write_manifest,
)
from seeder.system.mapped import release, resident_bytes, take_rows
from seeder.system.progress import Progress
from seeder.system.storage import fetch, join
from seeder.system.threads import intra_op_threads

STAGE_VERSION = 1
SEEDS_VERSION = 3  # 2: among nodes sharing a normalised name, the one spelled as in the question first; 3: dense scores are one dot product per pair
SUBGRAPH_VERSION = 2  # 2: the path_end column
PRIOR_VERSION = 7  # 2: seeds' relation profile; 3: per-hop model; 4: no detours; 5: order-free head; 6: shortest best paths; 7: wording, refits
KINDS = ("node", "relation", "query")
KIND_DIRS = {"node": "nodes", "relation": "relations", "query": "queries"}
TEST_STOP_ENV = "SEEDER_TEST_STOP_AFTER_SHARDS"


# ---------------------------------------------------------------------------------------------------
# Fingerprints and checks


SEED_SEARCH_FIELDS = (
    "search",
    "ann_min_nodes",
    "ann_nlist",
    "ann_nlist_factor",
    "ann_nprobe",
    "ann_extra",
    "ann_train_sample",
    "ann_seed",
    "ann_min_recall",
)
"""The ``seed`` fields of dense search, keyed by ``seed_search_key`` rather than as they stand."""


def seed_search_key(seed, num_nodes: int | None = None) -> dict[str, Any]:
    """The part of the seeds fingerprint that says how dense seeds are searched. Exact search adds
    nothing (seeds from before the ANN index, all exact, stay valid), nor do ANN settings that exact
    search ignores. ``search: auto`` is exact below ``ann_min_nodes`` when ``num_nodes`` is known;
    otherwise it keys every setting its outcome can depend on."""
    search = seed.search
    if search == "auto" and num_nodes is not None and num_nodes < seed.ann_min_nodes:
        search = "exact"
    if search == "exact":
        return {}
    ann = {k: getattr(seed, k) for k in ("ann_nlist", "ann_nprobe", "ann_extra", "ann_train_sample", "ann_seed")}
    if not seed.ann_nlist:
        ann["ann_nlist_factor"] = seed.ann_nlist_factor
    if search == "auto":  # the node count, the batch and the measured recall decide (seeder.retrieve.seeds)
        ann.update(ann_min_nodes=seed.ann_min_nodes, ann_min_recall=seed.ann_min_recall)
    return {"search": search, "ann": ann}


def stage_fingerprints(config: SeederConfig, dataset_fingerprint: str, num_nodes: int | None = None) -> dict[str, str]:
    """The fingerprint of every stage, each chained to its upstream stages' fingerprints. ``num_nodes``
    (the dataset's) lets ``seed.search: auto`` resolve to exact search on small graphs, which keeps
    their seeds fingerprint that of exact search (``seed_search_key``)."""
    encoder_key = embed_key(config)
    seed = {
        k: v for k, v in to_dict(config.seed).items() if k not in ("block_nodes", "block_queries", "screen", *SEED_SEARCH_FIELDS)
    }
    seed.update(seed_search_key(config.seed, num_nodes))
    if config.seed.strategy in ("bm25", "hybrid"):
        seed["baselines"] = to_dict(config.baselines)  # BM25 and fusion parameters shape these seeds
    fps: dict[str, str] = {}
    fps["embed"] = fingerprint_json({"stage": "embed", "v": STAGE_VERSION, "dataset": dataset_fingerprint, "embed": encoder_key})
    reduce = {k: v for k, v in to_dict(config.reduce).items() if k != "bfloat16_from_nodes"}
    if num_nodes is not None and bfloat16.applies(num_nodes, config.reduce.bfloat16_from_nodes):
        reduce["bfloat16_copy"] = True  # only then: the features of smaller graphs keep their fingerprint
    fps["features"] = fingerprint_json({"stage": "features", "v": STAGE_VERSION, "embed": fps["embed"], "reduce": reduce})
    fps["seeds"] = fingerprint_json({"stage": "seeds", "v": SEEDS_VERSION, "features": fps["features"], "seed": seed})
    expand = {k: v for k, v in to_dict(config.expand).items() if k not in ("batch_queries", "resident_features_gb")}
    if config.expand.relation_score == "learned":
        # Golden paths read the training answers; the prior and the subgraphs follow from them.
        prior = to_dict(config.prior)
        search = {k: prior[k] for k in ("neighbor_cap", "path_cap")}
        fps["paths"] = fingerprint_json(
            {"stage": "paths", "v": STAGE_VERSION, "seeds": fps["seeds"], "hops": config.expand.hops, "search": search}
        )
        unused = ("vote", "vote_temperature", "vote_floor") if config.prior.vote == "off" else ()
        unused += ("path_text", "answer_type", "local_match") if config.prior.question != "masked" else ()  # masked only
        fit = {k: v for k, v in prior.items() if k not in ("neighbor_cap", "path_cap", "batch_queries", *unused)}
        fps["prior"] = fingerprint_json(
            {"stage": "prior", "v": PRIOR_VERSION, "wording": WORDING_VERSION, "paths": fps["paths"], "fit": fit}
        )
        expand["prior"] = fps["prior"]
        expand["learned_version"] = 3  # 2: passed-over candidates are not carried; 3: log path terms
    fps["subgraphs"] = fingerprint_json({"stage": "subgraphs", "v": SUBGRAPH_VERSION, "seeds": fps["seeds"], "expand": expand})
    return fps


def check_config(config: SeederConfig) -> None:
    """Reject configs the stages cannot run, before any Ray work starts."""
    check_encoder(config.embed)
    e, r, s, x = config.embed, config.reduce, config.seed, config.expand
    if e.batch_size <= 0 or e.gpu_batch_size <= 0:
        raise ConfigError(
            f"embed.batch_size and embed.gpu_batch_size must be positive, got {e.batch_size} and {e.gpu_batch_size}"
        )
    if e.num_actors < 0 or e.cpus_per_actor <= 0 or e.actors_per_gpu < 1:
        raise ConfigError("embed.num_actors must be >= 0, embed.cpus_per_actor > 0 and embed.actors_per_gpu >= 1")
    if r.dim < 0:
        raise ConfigError(f"reduce.dim must be >= 0 (0 keeps the encoder width), got {r.dim}")
    if e.encoder == "hash" and r.dim > e.hash_dim:
        raise ConfigError(f"reduce.dim={r.dim} exceeds embed.hash_dim={e.hash_dim}; lower reduce.dim")
    if e.encoder == "minilm" and r.dim > 384:
        raise ConfigError(f"reduce.dim={r.dim} exceeds MiniLM's 384 dimensions; use 256 (paper) or less")
    if r.fit_sample <= 0:
        raise ConfigError(f"reduce.fit_sample must be positive, got {r.fit_sample}")
    if r.bfloat16_from_nodes < 0:
        raise ConfigError(
            f"reduce.bfloat16_from_nodes must be >= 0 (a node count; 0 never writes the bfloat16 copy), got {r.bfloat16_from_nodes}"
        )
    if s.k0 <= 0:
        raise ConfigError(f"seed.k0 must be positive, got {s.k0}")
    if s.search != "exact":
        check_ann_config(s)
    if x.budget < s.k0:
        raise ConfigError(f"expand.budget={x.budget} is smaller than seed.k0={s.k0}")
    # hops=0 means "derive" (seeder.preprocessing.derive), and only together with an empty keep_per_hop: say so first,
    # since a user who wrote hops=0 meant the hops, not the per-hop budget.
    if x.hops < 0 or (x.hops == 0 and x.keep_per_hop):
        raise ConfigError(
            f"expand.hops must be >= 1, or 0 (auto) to derive it from the training split together with "
            f"expand.keep_per_hop=[]; got expand.hops={x.hops}"
            + (f" with expand.keep_per_hop={x.keep_per_hop}" if x.keep_per_hop else "")
        )
    # An empty keep_per_hop is derived from the training split (seeder.preprocessing.derive), with hops or without.
    if x.keep_per_hop and len(x.keep_per_hop) != x.hops:
        raise ConfigError(
            f"expand.keep_per_hop={x.keep_per_hop} needs one entry per hop (expand.hops={x.hops}); "
            f"for example expand.keep_per_hop=[60,140] with expand.hops=2 (or expand.hops=0 and "
            f"expand.keep_per_hop=[] to derive both from the training split)"
        )
    p = config.prior
    if (
        min(p.neighbor_cap, p.path_cap, p.batch_queries, p.hidden_dim, p.epochs, p.batch_size, p.max_paths) <= 0
        or not (0 < p.keep_ratio <= 1)
        or not (0 <= p.holdout_fraction < 1)
        or not (p.lr > 0)
    ):
        raise ConfigError("prior: caps, sizes, epochs and lr must be positive, keep_ratio in (0, 1], holdout_fraction in [0, 1)")
    if not p.labelled_weight > 0:
        raise ConfigError(
            f"prior.labelled_weight must be positive (how much a labelled training question counts against a "
            f"generated one in the prior's fit), got {p.labelled_weight}"
        )
    if not (p.vote_temperature > 0 and p.vote_floor > 0):
        raise ConfigError(
            f"prior.vote_temperature and prior.vote_floor must be positive (a kernel width and the vote every "
            f"path starts from), got {p.vote_temperature} and {p.vote_floor}"
        )
    if not x.resident_features_gb >= 0:
        raise ConfigError(
            f"expand.resident_features_gb must be >= 0 (GiB of node features an expansion worker keeps "
            f"mapped; 0 lets them go after every block), got {x.resident_features_gb}"
        )
    if len(x.weights) != 3:
        raise ConfigError(f"expand.weights needs 3 entries (query-head, query-tail, query-relation), got {x.weights}")


# ---------------------------------------------------------------------------------------------------
# Resumable stage directories


def write_table_atomic(table: pa.Table, path: Path, **kwargs: Any) -> None:
    """Write a Parquet file under a temporary name and rename it: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    pq.write_table(table, tmp, **kwargs)
    os.replace(tmp, path)


@dataclass
class StageDir:
    """A stage's output directory, complete once its manifest (with the right fingerprint) exists."""

    root: Path
    name: str
    fingerprint: str
    layout: dict[str, Any] = field(default_factory=dict)  # the shard layout of the last open()

    @property
    def target(self) -> Path:
        return self.root / self.name

    @property
    def partial(self) -> Path:
        return self.root / f".{self.name}.partial"

    def complete_manifest(self) -> dict[str, Any] | None:
        manifest = read_manifest(self.target)
        if manifest is None or manifest.get("fingerprint") != self.fingerprint:
            return None
        return manifest

    def open(self, layout: dict[str, Any] | None = None) -> Path:
        """The working directory: kept from an interrupted run with the same fingerprint and shard
        layout (its finished shards are reused), otherwise started afresh."""
        self.layout = dict(layout or {})
        key = {"fingerprint": self.fingerprint, "layout": self.layout}
        key_file = self.partial / "partial.json"
        if self.partial.exists():
            try:
                same = json.loads(key_file.read_text()) == key
            except (OSError, ValueError):
                same = False
            if not same:
                shutil.rmtree(self.partial)
        if not self.partial.exists():
            self.partial.mkdir(parents=True)
            key_file.write_text(json.dumps(key))
        return self.partial

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Problems of the complete stage directory against its manifest's file records, checksums
        included (``seeder.system.io.verify_outputs``); empty when every file is as the stage wrote it."""
        return verify_outputs(self.target, manifest, deep=True, prefix=self.name)

    def reusable(self, echo: Callable[[str], None] = print) -> dict[str, Any] | None:
        """The stage's manifest when it is complete, has this fingerprint and its files verify;
        otherwise None. A complete stage whose files do not verify is reported (``echo``, one line
        per file and why) and turned back into a working directory that keeps its intact files (its
        shards), so that the rerun computes only what is missing."""
        manifest = self.complete_manifest()
        if manifest is None:
            return None
        problems = self.verify(manifest)
        if not problems:
            return manifest
        for line in problems[:20]:
            echo(f"{self.name}: {line}")
        if len(problems) > 20:
            echo(f"{self.name}: ... and {len(problems) - 20} more")
        echo(f"{self.name}: outputs do not match its manifest; recomputing {self.name} and the stages after it")
        self.salvage(manifest)
        return None

    def salvage(self, manifest: dict[str, Any]) -> None:
        """Move a damaged complete stage back to its working directory, keeping only the files that
        match their records (checksums), so that its shards are reused like those of a killed run."""
        records = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        shutil.rmtree(self.partial, ignore_errors=True)
        trash = self.root / f".{self.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(self.target, trash)
        try:
            self.partial.mkdir(parents=True)
            for rel, entry in records.items():
                path = trash / rel
                if not path.is_file() or path.stat().st_size != entry.get("bytes") or not checksum_matches(path, entry)[0]:
                    continue
                (self.partial / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, self.partial / rel)
            key = {"fingerprint": self.fingerprint, "layout": manifest.get("layout", {})}
            (self.partial / "partial.json").write_text(json.dumps(key))
        finally:
            shutil.rmtree(trash, ignore_errors=True)

    def discard_partial(self) -> None:
        """Drop a working directory kept from an earlier run (its inputs were recomputed since)."""
        shutil.rmtree(self.partial, ignore_errors=True)

    def commit(self, manifest: dict[str, Any], linked_from: Path | None = None) -> dict[str, Any]:
        """Record the files written (sizes, rows, checksums; a file linked from the stage directory
        ``linked_from`` keeps its checksum there), write the manifest last, then swap the working
        directory into place."""
        manifest = {"stage": self.name, "fingerprint": self.fingerprint, "completed": now(), "layout": self.layout, **manifest}
        (self.partial / "partial.json").unlink(missing_ok=True)
        for stray in self.partial.rglob(".*.tmp-*"):
            stray.unlink()
        start = time.perf_counter()
        manifest["files"] = file_records(self.partial, linked_from=linked_from)
        manifest["record_seconds"] = round(time.perf_counter() - start, 4)
        write_manifest(self.partial, manifest)
        if self.target.exists():
            trash = self.root / f".{self.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(self.target, trash)
            os.replace(self.partial, self.target)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(self.partial, self.target)
        return manifest


def maybe_stop_for_test(stage: str, shards_done: int) -> None:
    """Test hook: ``SEEDER_TEST_STOP_AFTER_SHARDS=subgraphs:2`` kills the process (no clean-up, like
    SIGKILL) once two shards of that stage were written in this run."""
    spec = os.environ.get(TEST_STOP_ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name == stage and shards_done >= int(count):
        print(f"{TEST_STOP_ENV}: stopping {stage} after {shards_done} shards", flush=True)
        os._exit(137)


# ---------------------------------------------------------------------------------------------------
# Embed stage: the texts, and the collector that turns streamed rows into whole shards


def embed_inputs(kg: KnowledgeGraph) -> dict[str, tuple[np.ndarray, pa.Array]]:
    """Per kind: (ids, texts). Queries are ordered by id; their row in that order is their shard row."""
    queries = kg.table("queries", ["id", "text"]).sort_by("id")
    return {
        "node": (np.arange(kg.num_nodes, dtype=np.int64), kg.table("nodes", ["text"]).column("text").combine_chunks()),
        "relation": (np.arange(2 * kg.num_relations, dtype=np.int64), pa.array(kg.relation_texts, pa.string())),
        "query": (queries.column("id").to_numpy(), queries.column("text").combine_chunks()),
    }


def embed_text_table(inputs: dict[str, tuple[np.ndarray, pa.Array]], pending: dict[str, np.ndarray], shard_rows: int) -> pa.Table:
    """Rows (kind, row, id, text) of the shard blocks still to embed; ``kind`` indexes ``KINDS`` and
    ``row`` is the position within its kind, which fixes the row's shard."""
    parts = []
    for kind_index, kind in enumerate(KINDS):
        ids, texts = inputs[kind]
        rows = np.arange(len(ids), dtype=np.int64)
        keep = np.isin(rows // shard_rows, pending[kind])
        if not keep.any():
            continue
        mask = pa.array(keep)
        parts.append(
            pa.table(
                {
                    "kind": pa.array(np.full(int(keep.sum()), kind_index, np.int8)),
                    "row": pa.array(rows[keep]),
                    "id": pa.array(ids[keep]),
                    "text": texts.filter(mask),
                }
            )
        )
    if not parts:
        return pa.table(
            {
                "kind": pa.array([], pa.int8()),
                "row": pa.array([], pa.int64()),
                "id": pa.array([], pa.int64()),
                "text": pa.array([], pa.string()),
            }
        )
    return pa.concat_tables(parts)


class ShardCollector:
    """Groups streamed ``(kind, row, id, embedding)`` rows into fixed row blocks of ``shard_rows`` and
    writes a block's shard (rows sorted, ids kept) as soon as all of its rows have arrived. Rows can
    arrive in any order (Ray Data does not keep it)."""

    def __init__(self, directory: Path, counts: dict[str, int], shard_rows: int):
        self.directory = directory
        self.counts = counts
        self.shard_rows = shard_rows
        self.buffers: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.filled: dict[tuple[int, int], int] = {}
        self.written = 0
        for kind in KINDS:
            (directory / KIND_DIRS[kind]).mkdir(parents=True, exist_ok=True)

    def shard_path(self, kind: str, block: int) -> Path:
        return self.directory / KIND_DIRS[kind] / f"part-{block:06d}.parquet"

    def num_blocks(self, kind: str) -> int:
        return -(-self.counts[kind] // self.shard_rows)

    def block_size(self, kind: str, block: int) -> int:
        return min(self.shard_rows, self.counts[kind] - block * self.shard_rows)

    def pending(self) -> dict[str, np.ndarray]:
        return {
            kind: np.array([b for b in range(self.num_blocks(kind)) if not self.shard_path(kind, b).exists()], dtype=np.int64)
            for kind in KINDS
        }

    def add(self, kind: np.ndarray, row: np.ndarray, ids: np.ndarray, embedding: np.ndarray) -> int:
        """Buffer one batch; returns how many shards it completed."""
        block = row // self.shard_rows
        key = kind.astype(np.int64) * (1 << 40) + block
        order = np.argsort(key, kind="stable")
        uniq, starts = np.unique(key[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        completed = 0
        for k, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist()):  # one step per block, not per row
            sel = order[s:e]
            group = (k >> 40, k & ((1 << 40) - 1))
            self.buffers.setdefault(group, []).append((row[sel], ids[sel], embedding[sel]))
            self.filled[group] = self.filled.get(group, 0) + len(sel)
            kind_name = KINDS[group[0]]
            expected = self.block_size(kind_name, group[1])
            if self.filled[group] > expected:
                raise DataError(
                    f"embed: block {group[1]} of {kind_name}s received {self.filled[group]} rows, expected {expected}"
                )
            if self.filled[group] == expected:
                self._write(kind_name, group)
                completed += 1
        return completed

    def _write(self, kind: str, group: tuple[int, int]) -> None:
        parts = self.buffers.pop(group)
        self.filled.pop(group)
        rows = np.concatenate([p[0] for p in parts])
        ids = np.concatenate([p[1] for p in parts])
        emb = np.concatenate([p[2] for p in parts]).astype(np.float32, copy=False)
        order = np.argsort(rows)
        if np.unique(rows).size != rows.size:
            raise DataError(f"embed: duplicate rows in block {group[1]} of {kind}s")
        table = pa.table({"id": pa.array(ids[order]), "embedding": embedding_column(emb[order])})
        write_table_atomic(table, self.shard_path(kind, group[1]))
        self.written += 1

    def unfinished(self) -> list[str]:
        return [f"{KINDS[k]} block {b} ({self.filled[(k, b)]} rows)" for k, b in self.buffers]


def embedding_column(emb: np.ndarray) -> pa.Array:
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])


def read_embedding_table(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One shard of ``(id, embedding)``, a local file or a file under a URI: (ids, float32 rows)."""
    table = storage.read_parquet(path)
    col = table.column("embedding").combine_chunks()
    emb = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)
    return table.column("id").to_numpy(), emb.astype(np.float32, copy=False)


class RowPlacer:
    """Where each shard's rows go in an array ordered as ``expected_ids`` (sorted), checking as shards
    arrive, in any order, that every id appears exactly once over all of them."""

    def __init__(self, expected_ids: np.ndarray, source: str | Path):
        self.expected_ids, self.source = expected_ids, source
        self.seen = np.zeros(len(expected_ids), dtype=bool)

    def positions(self, ids: np.ndarray, where: str | Path) -> np.ndarray:
        pos = np.minimum(np.searchsorted(self.expected_ids, ids), max(len(self.expected_ids) - 1, 0))
        if (
            (len(ids) and not len(self.expected_ids))
            or not np.array_equal(self.expected_ids[pos], ids)
            or self.seen[pos].any()
            or np.unique(pos).size != len(pos)
        ):
            raise DataError(f"{where}: embedded ids do not match the dataset's ids one to one; rerun the embed stage")
        self.seen[pos] = True
        return pos

    def check_complete(self) -> None:
        if not self.seen.all():
            missing = self.expected_ids[~self.seen]
            raise DataError(
                f"{self.source}: {len(missing)} ids have no embedding (first {missing[:3].tolist()}); rerun the embed stage"
            )


def embedding_files(directory: Path, expected_rows: int) -> list[Path]:
    """The shard files under ``directory``, refused unless they hold ``expected_rows`` rows in all."""
    files = sorted(directory.glob("part-*.parquet"))
    have = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    if not files or have != expected_rows:
        raise DataError(f"{directory}: {have} embedded rows, expected {expected_rows}; rerun the embed stage")
    return files


def embedding_shards(directory: Path, expected_ids: np.ndarray):
    """Yield ``(rows, embeddings)`` per shard of ``(id, embedding)`` under ``directory``: the positions
    of the shard's ids in ``expected_ids`` (sorted) and their float32 rows, one shard in memory at a
    time. Every id must appear exactly once over all shards (checked as they stream)."""
    placer = RowPlacer(expected_ids, directory)
    for file in embedding_files(directory, len(expected_ids)):
        ids, emb = read_embedding_table(file)
        yield placer.positions(ids, file), emb
    placer.check_complete()


def read_embeddings(directory: Path, expected_ids: np.ndarray) -> np.ndarray:
    """Assemble shards of ``(id, embedding)`` into rows ordered as ``expected_ids`` (sorted)."""
    out = None
    for pos, emb in embedding_shards(directory, expected_ids):
        if out is None:
            out = np.empty((len(expected_ids), emb.shape[1]), dtype=np.float32)
        out[pos] = emb
    return out


def read_embedding_rows(directory: Path, expected_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The embeddings of ``rows`` (sorted positions in ``expected_ids``), streamed shard by shard."""
    out = None
    for pos, emb in embedding_shards(directory, expected_ids):
        if out is None:
            out = np.empty((len(rows), emb.shape[1]), dtype=np.float32)
        wanted = np.isin(pos, rows)
        out[np.searchsorted(rows, pos[wanted])] = emb[wanted]
    return out


def finish_embed(partial: Path, kg: KnowledgeGraph) -> dict[str, Any]:
    """Turn relation shards into ``relations.npy`` and check node and query shards are complete."""
    inputs = embed_inputs(kg)
    relations = read_embeddings(partial / "relations", inputs["relation"][0])
    np.save(partial / "relations.npy", relations)
    shutil.rmtree(partial / "relations")
    width = relations.shape[1]
    for kind in ("node", "query"):
        files = sorted((partial / KIND_DIRS[kind]).glob("part-*.parquet"))
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        if rows != len(inputs[kind][0]):
            raise DataError(f"{partial}: {rows} {kind} embeddings written, expected {len(inputs[kind][0])}; rerun to finish")
    return {"dim": int(width), "counts": {k: int(len(v[0])) for k, v in inputs.items()}}


# ---------------------------------------------------------------------------------------------------
# Features stage (PCA, Appendix D.1)


def run_features(
    embed_dir: Path,
    out: Path,
    kg: KnowledgeGraph,
    config: SeederConfig,
    project_nodes: Callable[[list[str], PCA | None], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
) -> dict[str, Any]:
    """PCA fitted on a bounded, seeded sample of the node embeddings, then every row projected and
    L2-normalised. Node embeddings stream one shard at a time into a memory-mapped ``node.npy``, so
    the process never holds all of them (10M x 384 float32 would be 15 GB).

    ``project_nodes(shard_names, pca)`` yields ``(ids, features)`` for the node shards (names under
    ``embed/nodes``), in any order: by default this process projects them one by one; the Ray
    pipeline maps ``project_embedding_shard`` over its workers (``pipelines/preprocess.py``)."""
    inputs = embed_inputs(kg)
    node_ids = inputs["node"][0]
    relations = np.load(embed_dir / "relations.npy")
    queries = read_embeddings(embed_dir / "queries", inputs["query"][0])
    pca = None
    explained = None
    if config.reduce.dim:
        sample_rows = pca_sample_rows(len(node_ids), config.reduce.fit_sample, config.reduce.seed)
        sample = read_embedding_rows(embed_dir / "nodes", node_ids, sample_rows)
        with intra_op_threads(1):  # the same bits in a local run and in a job driver (one thread)
            pca = fit_pca(sample, config.reduce.dim, len(sample), config.reduce.seed)
        pca.save(out / "pca.npz")
        explained = float(pca.explained_variance.sum() / (float(np.var(sample, axis=0, dtype=np.float64).sum()) or 1.0))
    width = pca.dim if pca is not None else relations.shape[1]
    names = [f.name for f in embedding_files(embed_dir / "nodes", len(node_ids))]
    if project_nodes is None:
        project_nodes = lambda names, pca: (project_embedding_shard(embed_dir / "nodes" / n, pca) for n in names)
    nodes = np.lib.format.open_memmap(out / "node.npy", mode="w+", dtype=np.float32, shape=(len(node_ids), width))
    placer = RowPlacer(node_ids, embed_dir / "nodes")
    for ids, features in project_nodes(names, pca):
        rows = placer.positions(ids, embed_dir / "nodes")
        nodes[rows] = features
        if len(rows):  # written pages wait in the page cache for write-back, not in this process
            release(nodes[rows.min() : rows.max() + 1])
    placer.check_complete()
    nodes.flush()
    del nodes
    if bfloat16.applies(len(node_ids), config.reduce.bfloat16_from_nodes):
        bfloat16.write_copy(out)
    with intra_op_threads(1):
        np.save(out / "relation.npy", apply_pca(relations, pca))
        np.save(out / "query.npy", apply_pca(queries, pca))
    np.save(out / "query_ids.npy", inputs["query"][0])
    return {
        "dim": width,
        "input_dim": int(relations.shape[1]),
        "explained_variance": explained,
        "pca_sample": int(min(config.reduce.fit_sample, len(node_ids))) if pca is not None else 0,
    }


def project_embedding_shard(path: str | Path, pca: PCA | None) -> tuple[np.ndarray, np.ndarray]:
    """One node-embedding shard (a local file or one under a URI), projected by ``pca`` and
    L2-normalised: (ids, float32 features). Runs in any process or node."""
    ids, emb = read_embedding_table(path)
    with intra_op_threads(1):  # the same bits in a 1-CPU Ray task and in a process with every core
        return ids, apply_pca(emb, pca)


# ---------------------------------------------------------------------------------------------------
# Seeds stage


ANN_PILOT_NODES = 200_000
"""``seed.search: auto`` first builds the index over a seeded sample of this many nodes and measures its
recall there. Where even that pilot misses ``seed.ann_min_recall`` the full index is never built: on
the 10M-node hash-encoded graph it would hold a copy of every node row (10 GB) only to measure a recall
below the bar and fall back to exact search."""


def ann_pilot(query_features: np.ndarray, node_features: np.ndarray, cfg) -> dict[str, Any]:
    """The index's top-k0 recall on a seeded sample of ``ANN_PILOT_NODES`` nodes, against exact search over
    the same sample (``ann.sample_recall``). A smaller graph has fewer lists, so a query scans a larger
    share of it: the pilot errs on the hopeful side, and the full index is still checked after it."""
    start = time.perf_counter()
    rows = np.sort(np.random.default_rng(cfg.ann_seed).choice(len(node_features), ANN_PILOT_NODES, replace=False))
    nodes = np.ascontiguousarray(take_rows(node_features, rows), dtype=np.float32)  # not the whole mapping
    check = sample_recall(query_features, nodes, AnnIndex.build(nodes, cfg), cfg)
    return {"nodes": ANN_PILOT_NODES, **check, "seconds": round(time.perf_counter() - start, 3)}


def run_seeds(
    features_dir: Path, out: Path, kg: KnowledgeGraph, config: SeederConfig, dense_blocks: Callable | None = None
) -> dict[str, Any]:
    """Seed every query; the info says which dense search ran (``search``) and, for the ANN index, its
    parameters, build and search seconds, and its top-k0 recall against exact search on a seeded
    sample of the queries (``seed.search: auto`` seeds exactly when that recall is below
    ``seed.ann_min_recall``). ``dense_blocks(query_features, search, index)``, when given, computes
    the dense seeds instead of this process (the pipeline runs them as Ray tasks, ``dense_seed_block``)."""
    node_features = np.load(features_dir / "node.npy", mmap_mode="r")
    query_features = np.load(features_dir / "query.npy")
    query_ids = np.load(features_dir / "query_ids.npy")
    cfg = config.seed
    texts = None
    if cfg.strategy not in ("dense", "given"):
        texts = kg.table("queries", ["id", "text"]).sort_by("id").column("text").to_pylist()
    # entity seeds need no dense search, and hybrid fuses BM25 with its own exact ranking
    uses_dense = cfg.strategy not in ("entity", "hybrid")
    search = resolve_search(cfg, len(node_features), len(query_features)) if uses_dense else "exact"
    index, ann_info = None, {}
    if search == "ann" and cfg.search == "auto" and len(node_features) > ANN_PILOT_NODES:
        pilot = ann_pilot(query_features, node_features, cfg)
        ann_info = {"ann": {"pilot": pilot}}
        if pilot["recall"] < cfg.ann_min_recall:
            search, ann_info["ann"]["fell_back_to_exact"] = "exact", True
    if search == "ann":
        start = time.perf_counter()
        index = AnnIndex.build(node_features, cfg)
        build_seconds = time.perf_counter() - start
        check = sample_recall(query_features, node_features, index, cfg)
        ann_info = {
            "ann": {
                **ann_info.get("ann", {}),
                **index.info,
                "extra": cfg.ann_extra,
                "build_seconds": round(build_seconds, 3),
                **check,
            }
        }
        if cfg.search == "auto" and check["recall"] < cfg.ann_min_recall:
            search, index = "exact", None  # the sample says the index would lose seeds: exact it is
            ann_info["ann"]["fell_back_to_exact"] = True
    copy = bfloat16.written_copy(features_dir)
    screened = uses_dense and search == "exact" and copy is not None
    start = time.perf_counter()
    if dense_blocks is not None:
        dense = lambda features: dense_blocks(features, search, index)
    else:
        dense = lambda features: dense_search(features, node_features, cfg, index=index, search=search, screen_rows=copy)
    seeds, scores = seed_queries(
        kg, config, query_features, node_features, texts=texts, query_ids=query_ids, index=index, search=search, dense=dense
    )
    search_seconds = time.perf_counter() - start
    write_seed_table(out / "seeds.parquet", query_ids, seeds, scores)
    info = {**seed_stage_info(seeds, cfg, search), "seed_seconds": round(search_seconds, 3), **ann_info}
    if screened:
        info["screened"] = bfloat16.FILE_NAME  # the exact search screened the bfloat16 copy (the same seeds)
    return info


def seed_stage_info(seeds: np.ndarray, cfg, search: str) -> dict[str, Any]:
    """What every seeds stage records of its seeds ([Q, k0], -1 padded): counts, strategy and search."""
    return {
        "queries": int(len(seeds)),
        "k0": cfg.k0,
        "strategy": cfg.strategy,
        "empty": int((seeds < 0).all(axis=1).sum()),
        "search": search,
    }


def write_seed_table(path: Path, query_ids: np.ndarray, seeds: np.ndarray, scores: np.ndarray) -> None:
    """seeds.parquet: each question's seeds and their scores as lists (``seeds`` [Q, k0], -1 padded)."""
    valid = seeds >= 0
    offsets = pa.array(np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32))
    table = pa.table(
        {
            "query_id": pa.array(query_ids),
            "seeds": pa.ListArray.from_arrays(offsets, pa.array(seeds[valid])),
            "seed_scores": pa.ListArray.from_arrays(offsets, pa.array(scores[valid], pa.float32())),
        }
    )
    pq.write_table(table, path)


def dense_seed_block(
    artifacts: str, query_features: np.ndarray, config: dict, search: str, index
) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """Dense seeds of one block of queries, in any process or node: the node features are memory-mapped
    from the artifacts location (``stage_input``), ``index`` is the ANN index's bytes (``search: ann``)
    or None. Returns ((ids, scores) as ``dense_seeds`` does, counts)."""
    cfg = from_dict(SeederConfig, config).seed
    features = stage_input(artifacts, "features")
    nodes = np.load(features / "node.npy", mmap_mode="r")
    copy = bfloat16.written_copy(features)
    return dense_search(query_features, nodes, cfg, index=index, search=search, screen_rows=copy), {
        "queries": len(query_features)
    }


# ---------------------------------------------------------------------------------------------------
# Golden paths and prior stages (expand.relation_score: learned)


PRIOR_THREADS = 2
"""Threads of the prior's fit, whatever the machine: a fixed count gives the same bits everywhere, and
two fit MetaQA's prior 1.4x faster than one."""


def answer_csr(queries: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The ``answers`` list column of a queries table as (answer_ptr int64 [Q+1], answers int64)."""
    col = queries.column("answers").combine_chunks()
    counts = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return ptr, pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.int64)


def train_query_ids(kg: KnowledgeGraph) -> np.ndarray:
    """Ids of the training questions, ascending: the only questions whose answers these stages read."""
    return np.sort(kg.queries_of("train").column("id").to_numpy())


def paths_block(dataset: str, artifacts: str, query_ids: np.ndarray, config: dict) -> tuple[pa.Table, dict[str, Any]]:
    """Golden relation paths of one block of training questions: (the block's shard, counts).

    ``dataset`` and ``artifacts`` are locations (see ``stage_input``); the caller writes the shard."""
    start = time.perf_counter()
    cfg = from_dict(SeederConfig, config)
    kg = open_dataset(dataset)
    seed_qids, seeds, _ = _seed_arrays(str(stage_input(artifacts, "seeds") / "seeds.parquet"))
    seeds = seeds[np.searchsorted(seed_qids, query_ids)]
    queries = _query_table(dataset)
    picked = queries.take(pa.array(np.searchsorted(queries.column("id").to_numpy(), query_ids)))
    if set(picked.column("split").to_pylist()) - {"train"}:
        raise ValueError("golden paths read training answers only")
    answer_ptr, answers = answer_csr(picked)
    counts = np.diff(answer_ptr)
    found = golden_paths_batched(kg, seeds, answer_ptr, answers, cfg.expand.hops, cfg.prior)
    table = pa.table(
        {
            "query_id": pa.array(query_ids[found["query"]], pa.int64()),
            "length": pa.array(found["length"], pa.int8()),
            "code": pa.array(found["code"], pa.int64()),
            "hits": pa.array(found["hits"], pa.int32()),
            "reached": pa.array(found["reached"], pa.int32()),
            "answers": pa.array(counts[found["query"]].astype(np.int32), pa.int32()),
        }
    )
    return table.cast(GOLDEN_SCHEMA), {"queries": len(query_ids), "paths": table.num_rows, "seconds": time.perf_counter() - start}


def read_golden_paths(directory: Path) -> pa.Table:
    files = sorted(Path(directory).glob("part-*.parquet"))
    if not files:
        return GOLDEN_SCHEMA.empty_table()
    return pq.read_table(files).cast(GOLDEN_SCHEMA).sort_by([("query_id", "ascending"), ("code", "ascending")])


ENCODE_BLOCK = 4096
"""Texts the prior stage encodes at a time (one progress step each)."""


def artifacts_pca(artifacts: Path) -> PCA | None:
    """The features stage's PCA, or None where it kept the encoder's width (``reduce.dim=0``)."""
    path = artifacts / "features" / "pca.npz"
    return PCA.load(path) if path.exists() else None


def encode_in_blocks(texts: list[str], config: SeederConfig, label: str, unit: str, transform) -> list[np.ndarray]:
    """``transform`` of the dataset's encoder's embeddings of ``texts``, ``ENCODE_BLOCK`` at a time on the
    CPU, one progress step a block (the transform keeps only what the caller needs of each block)."""
    encoder = load_encoder(config.embed, device="cpu")
    parts = []
    with Progress(len(texts), label, unit=unit) as progress:
        for start in range(0, len(texts), ENCODE_BLOCK):
            block = texts[start : start + ENCODE_BLOCK]
            parts.append(transform(encoder.encode(block)))
            progress.update(len(block))
    return parts


def masked_question_features(
    kg: KnowledgeGraph,
    artifacts: Path,
    query_ids: np.ndarray,
    seeds: np.ndarray,
    config: SeederConfig,
    tails: np.ndarray,
    echo=print,
) -> np.ndarray:
    """[Q, d (+ T) (+ 2d)] what a ``prior.question: masked`` prior reads of these questions
    (``prior.masked_reading``): the masked question embedded by the dataset's encoder and projected by the
    features stage's PCA, with ``prior.answer_type`` the one-hot type it asks for among the graph's T node
    types, with ``prior.local_match`` its seed and asking windows, as the Retriever reads a new question.
    ``tails``: each relation id's tail type (``graph_tail_types``)."""
    texts = kg.queries.column("text").take(pa.array(kg.query_rows(query_ids))).to_pylist()
    pca = artifacts_pca(artifacts)
    names = type_names(tails) if config.prior.answer_type else None

    def encode(label: str, transform):
        return lambda t: np.concatenate(encode_in_blocks(t, config, f"prior: {label}", "texts", transform))

    reading, asked = masked_reading(
        texts,
        seed_names(kg.node_names, seeds),
        seed_names(kg.node_types, seeds),
        encode("masked questions and their windows", lambda x: apply_pca(x, pca)),
        encode("asking words", l2_normalize),
        names,
        config.prior.local_match,
    )
    if names is not None:
        named, words = asked >= 0, np.asarray(asked_words(texts), dtype=object)
        heads, counts = np.unique(words[named], return_counts=True)
        type_of = dict(zip(words[named], asked[named]))
        common = ", ".join(f"{w}: {names[type_of[w]]}" for w in heads[np.argsort(-counts, kind="stable")][:8])
        share = named.mean() if len(named) else 0.0
        echo(f"prior: {share:.2f} of the questions ask for a node type by their words ({common or 'none'})")
    return reading


def graph_tail_types(kg: KnowledgeGraph) -> np.ndarray:
    """[2R] the commonest type of the nodes each relation id leads to (``relation_tail_types``)."""
    node_types = kg.node_types.to_numpy(zero_copy_only=False)
    return relation_tail_types(kg.neighbors, kg.edge_relations, node_types, 2 * kg.num_relations)


def run_prior(artifacts: Path, out: Path, kg: KnowledgeGraph, config: SeederConfig, echo=print) -> dict[str, Any]:
    """Fit the relation-path prior on the golden paths (training questions only) and save it. A prior
    that reads masked questions (``prior.question``) keeps what it reads of every question of the
    dataset beside it (``question.npy``, rows as ``question_ids.npy``): the subgraphs stage reads them."""
    golden = read_golden_paths(artifacts / "paths")
    query_ids = train_query_ids(kg)
    seed_qids, seeds, _ = read_seed_table(artifacts / "seeds" / "seeds.parquet")
    train_seeds = seeds[np.searchsorted(seed_qids, query_ids)]
    tails = graph_tail_types(kg)  # one pass over the edges, for the asked type, the path text and the windows
    if config.prior.question == "masked":
        # A fixed thread count, as for the fit below: the same bits on any node.
        with intra_op_threads(PRIOR_THREADS):
            every = masked_question_features(kg, artifacts, seed_qids, seeds, config, tails, echo)
        np.save(out / "question.npy", every)
        np.save(out / "question_ids.npy", seed_qids)
        query_features = every[np.searchsorted(seed_qids, query_ids)]
    else:
        all_ids = np.load(artifacts / "features" / "query_ids.npy")
        query_features = np.load(artifacts / "features" / "query.npy", mmap_mode="r")[np.searchsorted(all_ids, query_ids)]
    profile = seed_relation_profile(kg.indptr, kg.edge_relations, train_seeds, 2 * kg.num_relations)
    wording = None
    if config.prior.wording_dim:
        texts = kg.queries.column("text").take(pa.array(kg.query_rows(query_ids))).to_pylist()
        wording = question_form(texts, seed_names(kg.node_names, train_seeds), config.prior.wording_dim)
    qid = golden.column("query_id").to_numpy()
    code = golden.column("code").to_numpy()
    kept, weight, _ = path_targets(
        qid,
        code,
        golden.column("hits").to_numpy(),
        golden.column("reached").to_numpy(),
        golden.column("answers").to_numpy(),
        config.prior.keep_ratio,
        2 * kg.num_relations,
    )
    rows = np.searchsorted(query_ids, qid[kept])
    labelled = ~generated_mask(kg, query_ids)
    phrasings = question_phrasings(kg, query_ids)
    # A masked reading is [question d | asked type T | seed and asking windows 2d]; the MLP reads the first two.
    masked = config.prior.question == "masked"
    question_dim = np.load(artifacts / "features" / "query.npy", mmap_mode="r").shape[1]  # d, PCA'd or not
    asked_width = len(type_names(tails)) if masked and config.prior.answer_type else 0
    read_width = question_dim + asked_width
    inputs = prior_inputs(query_features[:, :read_width], profile, wording)
    # A fixed thread count, so that the prior is the same bits on any node of any cluster: the job
    # driver of `ray job submit` runs with one thread, a local run with one per core, and two thread
    # counts split the products' sums differently.
    with intra_op_threads(PRIOR_THREADS):
        prior = train_prior(
            inputs,
            rows,
            code[kept],
            weight,
            query_ids,
            2 * kg.num_relations,
            config.prior,
            echo=echo,
            wording_dim=config.prior.wording_dim,
            question_weight=np.where(labelled, config.prior.labelled_weight, 1.0),
            phrasings=phrasings,
        )
    prior.question = config.prior.question
    if asked_width:
        prior.answer_types = AnswerTypes.build(type_names(tails), tails, prior.vocab, 2 * kg.num_relations, question_dim)
    if masked and config.prior.path_text:
        with intra_op_threads(PRIOR_THREADS):
            prior.path_text = fit_path_text(
                kg, artifacts, prior, inputs, rows, code[kept], query_ids, phrasings, config, tails, echo
            )
        if prior.path_text is not None:
            prior.info["path_text_weight"] = prior.path_text.weight
    if masked and config.prior.local_match:
        with intra_op_threads(PRIOR_THREADS):
            whole = prior_inputs(query_features, profile, wording)
            prior.local_match = fit_local_match(
                kg, artifacts, prior, whole, rows, code[kept], query_ids, phrasings, config, tails, read_width, echo
            )
        prior.info["local_match_weights"] = [prior.local_match.seed_weight, prior.local_match.ask_weight]
    if config.prior.vote == "labelled":
        mine = labelled[rows]
        prior.vote = LabelledVote.build(
            query_features[:, :question_dim],
            rows[mine],
            code[kept][mine],
            weight[mine],
            prior.vocab,
            config.prior.vote_temperature,
            config.prior.vote_floor,
        )
        prior.info["vote_questions"] = prior.vote.size if prior.vote is not None else 0
        echo(f"prior: {prior.info['vote_questions']:,} labelled training questions vote for their paths")
    prior.save(out)
    return {**prior.info, "golden_rows": int(golden.num_rows), "target_rows": int(len(kept))}


def fit_path_text(
    kg: KnowledgeGraph,
    artifacts: Path,
    prior: RelationPathPrior,
    inputs: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    query_ids: np.ndarray,
    phrasings: np.ndarray,
    config: SeederConfig,
    tails: np.ndarray,
    echo=print,
) -> PathText | None:
    """The prior's vocabulary written as questions and embedded (``seeder.retrieve.path_text``), with
    the match weight ``choose_weight`` picks on the held-out training questions (those the prior's fit
    held out, ``held_out_targets``; ``rows`` and ``codes`` are the target rows)."""
    if len(prior.vocab) > PATH_TEXT_MAX:
        echo(f"prior: {len(prior.vocab):,} relation paths, more than {PATH_TEXT_MAX:,}: no path-text match")
        return None
    num_ids = 2 * kg.num_relations
    texts = render_paths(prior.vocab, num_ids, kg.relation_texts, tails)
    embedded = encode_in_blocks(texts, config, "prior: relation paths as questions", "paths", l2_normalize)
    text = PathText.build(np.concatenate(embedded), artifacts_pca(artifacts))
    x, keys = held_out_targets(prior, inputs, rows, codes, query_ids, phrasings, config)
    text.weight, shares = choose_weight(prior.probs(x), text, x[:, : text.dim], keys)
    table = ", ".join(f"{w:g}: {s:.3f}" for w, s in shares.items())
    echo(f"prior: path-text weight {text.weight:g} (held-out top path a target by weight: {table})")
    return text


def held_out_targets(
    prior: RelationPathPrior,
    inputs: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    query_ids: np.ndarray,
    phrasings: np.ndarray,
    config: SeederConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """The inputs of the training questions the prior's fit held out (``held_out_questions``) and the
    sorted ``row * V + slot`` of their target paths: what the match weights are chosen on."""
    questions = np.unique(rows)
    cfg = config.prior
    held = questions[held_out_questions(query_ids[questions], cfg.holdout_fraction, phrasings[questions], cfg.seed)]
    position = np.minimum(np.searchsorted(held, rows), len(held) - 1)
    known, slot = sorted_lookup(prior.vocab, codes)
    mine = (held[position] == rows) & known
    return np.asarray(inputs[held], np.float32), np.unique(position[mine] * len(prior.vocab) + slot[mine])


def fit_local_match(
    kg: KnowledgeGraph,
    artifacts: Path,
    prior: RelationPathPrior,
    inputs: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    query_ids: np.ndarray,
    phrasings: np.ndarray,
    config: SeederConfig,
    tails: np.ndarray,
    offset: int,
    echo=print,
) -> LocalMatch:
    """Each relation id written as a one-hop question and embedded like the questions
    (``seeder.retrieve.local_match``), with the window weights ``choose_weights`` picks on the held-out
    training questions; ``inputs`` hold the windows from column ``offset``."""
    num_ids = 2 * kg.num_relations
    texts = render_paths(ROOT * num_ids + np.arange(num_ids), num_ids, kg.relation_texts, tails)
    pca = artifacts_pca(artifacts)
    relations = np.concatenate(
        encode_in_blocks(texts, config, "prior: relations as questions", "relations", lambda x: apply_pca(x, pca))
    )
    match = LocalMatch.build(relations, prior.vocab, num_ids, offset)
    x, keys = held_out_targets(prior, inputs, rows, codes, query_ids, phrasings, config)
    prior.local_match = match  # at weights 0: the MLP skips the windows, nothing is reweighed yet
    (match.seed_weight, match.ask_weight), shares = choose_weights(prior.probs(x), match, x, keys)
    best = sorted(shares.items(), key=lambda kv: -kv[1])[:4]
    table = ", ".join(f"{a:g}/{b:g}: {s:.3f}" for (a, b), s in best)
    echo(
        f"prior: seed/asking window weights {match.seed_weight:g}/{match.ask_weight:g} "
        f"(held-out top path a target, best pairs: {table}; 0/0: {shares[(0.0, 0.0)]:.3f})"
    )
    return match


def generated_mask(kg: KnowledgeGraph, query_ids: np.ndarray) -> np.ndarray:
    """[Q] whether each of these questions was generated by ``seeder questions`` (False for a dataset
    without the ``generated`` column: all its questions are labelled)."""
    return query_column(kg, query_ids, "generated", False).astype(bool)


def question_phrasings(kg: KnowledgeGraph, query_ids: np.ndarray) -> np.ndarray:
    """[Q] the phrasing (template) each of these questions was generated with by ``seeder questions``,
    -1 for a real question or a dataset without the ``phrasing`` column."""
    return query_column(kg, query_ids, "phrasing", -1).astype(np.int64)


def query_column(kg: KnowledgeGraph, query_ids: np.ndarray, name: str, missing: Any) -> np.ndarray:
    """[Q] column ``name`` of queries.parquet for these ids, ``missing`` where it is null or absent."""
    if name not in kg.queries.column_names:
        return np.full(len(query_ids), missing)
    column = kg.queries.column(name).take(pa.array(kg.query_rows(query_ids)))
    return np.asarray(column.fill_null(missing).to_numpy(zero_copy_only=False))


def path_summary(artifacts: Path, kg: KnowledgeGraph, top: int = 10) -> list[str]:
    """The most frequent target paths of the training questions, for the run's log."""
    golden = read_golden_paths(artifacts / "paths")
    if golden.num_rows == 0:
        return []
    qid, code = golden.column("query_id").to_numpy(), golden.column("code").to_numpy()
    kept, _, _ = path_targets(
        qid,
        code,
        golden.column("hits").to_numpy(),
        golden.column("reached").to_numpy(),
        golden.column("answers").to_numpy(),
        0.999,
        2 * kg.num_relations,
    )
    uniq, counts = np.unique(code[kept], return_counts=True)
    order = np.argsort(-counts, kind="stable")[:top]
    names = kg.relation_names
    return [f"  {counts[i]:>7,}  {describe(int(uniq[i]), names)}" for i in order]


# ---------------------------------------------------------------------------------------------------
# Subgraphs stage: one block of queries, run in a worker that opens everything from its location


def stage_input(artifacts: str, stage: str) -> Path:
    """A finished stage's directory as a local path, in whichever process and node asks: a local
    ``artifacts`` path is read in place (it must then exist on every node, as a shared filesystem
    does), a URI's stage directory is fetched into this node's cache (``seeder.system.storage.fetch``)."""
    return fetch(join(artifacts, stage))


def query_blocks(query_ids: np.ndarray, block_size: int) -> list[np.ndarray]:
    return [query_ids[i : i + block_size] for i in range(0, len(query_ids), block_size)]


def subgraph_shard_path(directory: Path, block: int) -> Path:
    return Path(directory) / f"part-{block:06d}.parquet"


SHARD_WRITE = {"use_dictionary": False, "compression": "lz4"}
"""Parquet options of a query block's shard: its list columns hold mostly distinct ids and scores, so
a dictionary is built only to be dropped; without it, and with lz4, a shard writes a third faster
and reads as fast, for somewhat larger files."""


@lru_cache(maxsize=2)
def _query_table(dataset: str) -> pa.Table:
    return open_dataset(dataset).table("queries", ["id", "split", "answers", "text"]).sort_by("id")


@lru_cache(maxsize=1)
def _dataset(dataset: str) -> KnowledgeGraph:
    """One opened dataset per worker process, so that what it reads on demand (the node names the
    prior's wording reads) is read once, not by every block."""
    return open_dataset(dataset)


@lru_cache(maxsize=1)
def _graph_index(dataset: str):
    """One GraphIndex per worker process, reused by every block that worker expands."""
    return GraphIndex.build(_dataset(dataset))


@lru_cache(maxsize=2)
def _seed_arrays(seeds_file: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One read per worker process, shared by every block it expands."""
    return read_seed_table(seeds_file)


def _features(directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(the filter's node rows (``bfloat16.filter_features``), relation and query features, query ids) of
    a features stage, memory-mapped once per worker process and reused by every block it expands: a
    block of a large graph reads node rows from all over ``node.npy`` (or its bfloat16 copy), and a
    fresh mapping per block faulted them all in again (at ten million nodes, nearly half of a block's
    time). A rewritten stage (a new ``node.npy``) is mapped afresh."""
    stat = os.stat(Path(directory) / "node.npy")
    return _mapped_features(str(directory), stat.st_ino, stat.st_mtime_ns)


@lru_cache(maxsize=1)
def _mapped_features(directory: str, inode: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    path = Path(directory)
    return (
        bfloat16.filter_features(path),
        np.load(path / "relation.npy", mmap_mode="r"),
        np.load(path / "query.npy", mmap_mode="r"),
        np.load(path / "query_ids.npy"),
    )


@lru_cache(maxsize=1)
def _prior(directory: str):
    return RelationPathPrior.load(Path(directory))


def expand_block(dataset: str, artifacts: str, query_ids: np.ndarray, config: dict) -> tuple[pa.Table, dict[str, Any]]:
    """Expand one block of queries: (the block's subgraph shard, counts). The graph and the features
    are opened from their locations and memory-mapped (``stage_input``), so a worker never receives
    them through Ray; the caller writes the shard."""
    start = time.perf_counter()
    cfg = from_dict(SeederConfig, config)
    kg = _dataset(dataset)
    node_features, relation_features, query_features, all_query_ids = _features(stage_input(artifacts, "features"))
    rows = np.searchsorted(all_query_ids, query_ids)
    seed_qids, seeds, seed_scores = _seed_arrays(str(stage_input(artifacts, "seeds") / "seeds.parquet"))
    seed_rows = np.searchsorted(seed_qids, query_ids)
    queries = _query_table(dataset)
    q_rows = np.searchsorted(queries.column("id").to_numpy(), query_ids)
    picked = queries.take(pa.array(q_rows))
    answer_ptr, answers = answer_csr(picked)
    splits = np.asarray(picked.column("split").to_pylist(), dtype=object)
    prior_dir = stage_input(artifacts, "prior") if cfg.expand.relation_score == "learned" else None
    prior = _prior(str(prior_dir)) if prior_dir else None
    prior_features = prior_question_rows(prior_dir, query_ids) if prior and prior.question == "masked" else None
    subgraphs = expand_queries(
        kg,
        node_features,
        relation_features,
        np.asarray(query_features[rows]),
        seeds[seed_rows],
        seed_scores[seed_rows],
        cfg.expand,
        query_ids,
        splits,
        answer_ptr,
        answers,
        graph=_graph_index(dataset),
        prior=prior,
        texts=picked.column("text").to_pylist(),
        prior_features=prior_features,
    )
    # Checked between blocks, not batches: one batch's scattered reads map most of the file through
    # the kernel's fault-around, so a tighter check would only pay to map the pages again.
    resident = resident_bytes(node_features)
    if resident is not None and resident > cfg.expand.resident_features_gb * 2**30:
        release(node_features)
    return subgraphs.to_arrow(), {
        "queries": len(query_ids),
        "nodes": int(subgraphs.sizes.sum()),
        "edges": int(subgraphs.edge_ptr[-1]),
        "seconds": time.perf_counter() - start,
    }


# ---------------------------------------------------------------------------------------------------
# Summary


def ceilings(subgraphs: SubgraphSet, kg: KnowledgeGraph) -> dict[str, Any]:
    """Subgraph ceiling (Hit@any, Recall@any of the bounded subgraphs) overall and per split, and per
    value of each query attribute that makes groups (e.g. ``hop``; see seeder.retrieve.metrics)."""
    # Per-query values first, put in query-id order: the means do not depend on the order of the shards,
    # and no split's subgraphs are copied.
    order = np.argsort(subgraphs.query_ids, kind="stable")
    values = {name: v[order] for name, v in ceiling_values(subgraphs).items()}
    query_ids, splits = subgraphs.query_ids[order], subgraphs.splits[order]
    out: dict[str, Any] = {}
    for split in ["all", *sorted(set(splits.tolist()))]:
        rows = np.ones(len(splits), bool) if split == "all" else splits == split
        part = {name: v[rows] for name, v in values.items()}
        out[split] = group_means(part, group_by(kg.query_attributes(query_ids[rows])) or None)
    return out


@dataclass
class StageTimer:
    """Collects one line and one summary entry per stage."""

    stages: dict[str, Any] = field(default_factory=dict)
    echo: Callable[[str], None] = print

    def record(self, name: str, seconds: float, items: int, unit: str, detail: str, skipped: bool = False, **extra: Any) -> None:
        rate = items / seconds if seconds > 0 else float("inf")
        self.stages[name] = {
            "seconds": round(seconds, 3),
            "items": items,
            "unit": unit,
            "per_second": round(rate, 1),
            "skipped": skipped,
            **extra,
        }
        note = " (skipped: up to date, timing from the run that built it)" if skipped else ""
        self.echo(f"{name}: {detail} in {seconds:.1f} s ({rate:,.0f} {unit}/s){note}")


def format_ceilings(ceiling: dict[str, Any]) -> list[str]:
    """One console line per split and query group, e.g. ``ceiling test hop=2: hit_any 0.91 ...``."""
    lines = []
    for split, groups in ceiling.items():
        for group, entry in groups.items():
            values = " ".join(f"{k} {v:.4f}" for k, v in entry.items() if k != "queries")
            lines.append(f"ceiling {split:5s} {group:12s}: {values} ({entry.get('queries', 0):,} queries)")
    return lines


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    path = Path(out) / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    os.replace(tmp, path)
    return path
