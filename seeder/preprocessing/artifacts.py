"""Preprocessing artifacts: what ``pipelines/preprocess.py`` writes and every later stage reads.

Layout of an artifacts directory (each stage directory is complete only once its manifest exists)::

    manifest.json            dataset path and fingerprint, the resolved config, per-stage summaries
    embed/                   raw encoder output (encoder dimension), one row per id
        nodes/*.parquet      id int64, embedding fixed_size_list<float32>
        relations.npy        float32 [2R, D]  (base relations, then inverses)
        queries/*.parquet    id int64, embedding
    features/                PCA-reduced, L2-normalised; row i of node.npy is node i
        node.npy             float32 [N, d]
        node_bf16.npy        uint16 [N, d], bfloat16 bits of node.npy, on large graphs only (K-HOP's filter)
        relation.npy         float32 [2R, d]
        query.npy            float32 [Q, d], rows ordered as query_ids.npy
        query_ids.npy        int64 [Q], ascending
        pca.npz              mean [D], components [d, D]
    seeds/
        seeds.parquet        query_id int64, seeds list<int64>, seed_scores list<float32>
    paths/, prior/           with expand.relation_score: learned; the golden paths, and the prior
        prior.npz, prior.json  its weights and description (seeder.retrieve.prior)
        question.npy         with prior.question: masked, float32 [Q, d]: every question embedded with
        question_ids.npy       its seeds' names masked, PCA'd; rows ordered as question_ids.npy
    subgraphs/
        part-*.parquet       seeder.data.subgraphs.SUBGRAPH_SCHEMA, one row per query
    summary.json             run summary: per-stage time and throughput, subgraph ceilings

Stores ids, never copies of embeddings: the trainer gathers features from ``node.npy``.

Every stage's ``manifest.json`` records the files it wrote (``files``: bytes, rows, xxh3 checksum;
``seeder.system.io.file_records``). A preprocessing rerun checks the checksums and recomputes a stage whose
files are missing or damaged, naming them; ``open_artifacts`` checks that the readers' stages' files
exist with their recorded sizes (no reading) and raises a DataError naming the file and the rerun
command. The top-level manifest records the dataset's fingerprint: a dataset rewritten since is an
error naming both fingerprints (``accept_mismatch`` / ``--accept-mismatch`` makes it a warning).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seeder.config import SeederConfig, from_dict
from seeder.data.store import KnowledgeGraph, open_dataset
from seeder.data.subgraphs import SubgraphSet
from seeder.features import bfloat16
from seeder.system.io import DataError, fingerprint_json, read_manifest, verify_outputs
from seeder.system.storage import fetch

# Stages a reader of artifacts opens (training, evaluation, retrieval): ``open_artifacts`` checks their
# files. The embed and paths stages are read by later preprocessing stages only.
READ_STAGES = ("features", "seeds", "prior", "subgraphs")


class FingerprintMismatch(DataError):
    """Artifacts and the dataset (or a model and the artifacts) do not belong together."""


def warn_mismatch(message: str) -> None:
    """A mismatch the user accepted explicitly (``accept_mismatch`` / ``--accept-mismatch``)."""
    warnings.warn(f"{message} (accepted: --accept-mismatch)", UserWarning, stacklevel=3)


def _prior_questions(directory: str) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, features) of what a masked-question prior reads, kept beside it by ``run_prior``;
    mapped once per process and prior (a refitted prior is a new file)."""
    stat = os.stat(Path(directory) / "question.npy")
    return _mapped_prior_questions(directory, stat.st_ino, stat.st_mtime_ns)


@lru_cache(maxsize=1)
def _mapped_prior_questions(directory: str, inode: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    return np.load(Path(directory) / "question_ids.npy"), np.load(Path(directory) / "question.npy", mmap_mode="r")


def prior_question_rows(directory: Path, query_ids: np.ndarray) -> np.ndarray:
    """The masked-question features of these queries; a clear error for a question the prior's stage
    never saw (an update that adds questions and keeps the prior)."""
    ids, features = _prior_questions(str(directory))
    rows = np.minimum(np.searchsorted(ids, query_ids), max(len(ids) - 1, 0))
    missing = query_ids[ids[rows] != query_ids] if len(ids) else query_ids
    if len(missing):
        raise DataError(
            f"{directory}: the relation-path prior reads masked questions (prior.question: masked) and has not "
            f"read {len(missing):,} of these questions (ids {missing[:5].tolist()}...): rerun the update with "
            "--refit-prior, or preprocess again"
        )
    return np.asarray(features[rows])


@dataclass
class Artifacts:
    path: Path
    manifest: dict[str, Any]
    accept_mismatch: bool = False  # a dataset whose fingerprint differs is a warning, not an error

    @cached_property
    def config(self) -> SeederConfig:
        return from_dict(SeederConfig, self.manifest["config"])

    @property
    def step_budget(self) -> dict[str, list[int]] | None:
        """The policy's step budget preprocessing derived from the golden paths (seeder.preprocessing.derive), or None
        where it derived nothing (a config file set the choices)."""
        return self.manifest.get("step_budget")

    @property
    def fingerprint(self) -> str | None:
        """One fingerprint of what the artifacts are: their stage fingerprints (dataset, config) together."""
        stages = self.manifest.get("fingerprints")
        return fingerprint_json(stages) if stages else None

    @property
    def dataset_fingerprint(self) -> str | None:
        return self.manifest.get("dataset_fingerprint")

    def rerun_hint(self) -> str:
        return f"rerun `python pipelines/preprocess.py --dataset {self.manifest.get('dataset')} --out {self.path}`"

    @cached_property
    def dataset(self) -> KnowledgeGraph:
        kg = open_dataset(self.manifest["dataset"])
        recorded = self.dataset_fingerprint
        if recorded and kg.fingerprint != recorded:
            message = (
                f"{self.path}: built from dataset fingerprint {recorded}, but the dataset at "
                f"{self.manifest['dataset']} now has fingerprint {kg.fingerprint} (it was rewritten since); "
                f"{self.rerun_hint()} to rebuild the artifacts, or pass --accept-mismatch to use them anyway"
            )
            if not self.accept_mismatch:
                raise FingerprintMismatch(message)
            warn_mismatch(message)
        return kg

    def verify(self, stages: tuple[str, ...] = READ_STAGES) -> None:
        """Cheap check (existence and sizes, no reading) of the files the stages' manifests record; a
        DataError names the first files that differ and the fix. Stages whose manifests record no files
        (written by an older seeder) are not checked."""
        problems = []
        for stage in stages:
            manifest = read_manifest(self.path / stage)
            if manifest is None or not isinstance(manifest.get("files"), dict):
                continue
            problems += [f"{self.path}/{line}" for line in verify_outputs(self.path / stage, manifest, deep=False)]
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise DataError(
                f"{'; '.join(problems[:3])}{more}: the artifacts are damaged or incomplete; "
                f"{self.rerun_hint()} to recompute what is missing"
            )

    def check_finished(self) -> None:
        """Refuse artifacts whose preprocessing has not finished (killed, or still running): every stage
        the run set out to write (the top manifest's ``fingerprints``) must be complete with that
        fingerprint. A switch of a live service checks this, so that it never answers from a version
        that is half there; a DataError names the first unfinished stage and the fix."""
        for stage, fingerprint in (self.manifest.get("fingerprints") or {}).items():
            if (read_manifest(self.path / stage) or {}).get("fingerprint") != fingerprint:
                parent = ((self.manifest.get("update") or {}).get("parent") or {}).get("path")
                hint = self.rerun_hint()[:-1] + (f" --update {parent}`" if parent else "`")
                raise DataError(
                    f"{self.path}/{stage}: this stage is not finished (killed, or still being written), so the "
                    f"artifacts are not a complete version; {hint} to finish them first"
                )

    def _require(self, stage: str) -> Path:
        directory = self.path / stage
        if read_manifest(directory) is None:
            raise DataError(
                f"{directory}: stage '{stage}' is missing or incomplete; run pipelines/preprocess.py "
                f"--dataset {self.manifest.get('dataset')} --out {self.path}"
            )
        return directory

    @cached_property
    def node_features(self) -> np.ndarray:
        return np.load(self._require("features") / "node.npy", mmap_mode="r")

    @cached_property
    def filter_features(self) -> np.ndarray:
        """The node rows K-HOP's filter reads: ``node.npy``, or its bfloat16 copy on a large graph
        (``seeder.features.bfloat16``), so that a served question is expanded as preprocessing did."""
        return bfloat16.filter_features(self._require("features"))

    @cached_property
    def relation_features(self) -> np.ndarray:
        return np.load(self._require("features") / "relation.npy", mmap_mode="r")

    @cached_property
    def query_features(self) -> np.ndarray:
        return np.load(self._require("features") / "query.npy", mmap_mode="r")

    @cached_property
    def query_ids(self) -> np.ndarray:
        return np.load(self._require("features") / "query_ids.npy")

    def query_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ``query_features`` for query ids ``ids``; unknown ids are an error."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.searchsorted(self.query_ids, ids)
        rows = np.minimum(rows, len(self.query_ids) - 1)
        missing = self.query_ids[rows] != ids
        if missing.any():
            raise DataError(f"{self.path}: query ids not in the artifacts, first: {ids[missing][:5].tolist()}")
        return rows

    def seeds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query_ids [Q], seeds [Q, k0] int64 padded -1, seed_scores [Q, k0] float32)."""
        return read_seed_table(self._require("seeds") / "seeds.parquet")

    def prior(self):
        """The relation-path prior of ``expand.relation_score: learned`` (``seeder.retrieve.prior``)."""
        from seeder.retrieve.prior import RelationPathPrior  # pandas: only when a prior is read

        return RelationPathPrior.load(self._require("prior"))

    def prior_questions(self, ids: np.ndarray) -> np.ndarray:
        """What a prior of ``prior.question: masked`` read of the queries ``ids`` (``prior_question_rows``)."""
        return prior_question_rows(self._require("prior"), np.asarray(ids, dtype=np.int64))

    def query_texts(self, ids: np.ndarray) -> list[str]:
        """The text of the dataset's queries ``ids``, in that order."""
        rows = self.dataset.query_rows(np.asarray(ids, dtype=np.int64))
        return self.dataset.queries.column("text").take(pa.array(rows)).to_pylist()

    def subgraphs(self, split: str | None = None) -> SubgraphSet:
        return SubgraphSet.read(self._require("subgraphs"), split=split)


def read_seed_table(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeds.parquet as (query_ids [Q] ascending, seeds [Q, k0] int64 padded -1, scores [Q, k0] float32
    padded -inf); k0 is the longest seed list."""
    table = pq.read_table(path).sort_by("query_id")
    col = table.column("seeds").combine_chunks()
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    width = int(lengths.max(initial=0))
    mask = np.arange(width)[None, :] < lengths[:, None]
    seeds = np.full((table.num_rows, width), -1, np.int64)
    scores = np.full((table.num_rows, width), -np.inf, np.float32)
    seeds[mask] = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    scores[mask] = pc.list_flatten(table.column("seed_scores").combine_chunks()).to_numpy(zero_copy_only=False)
    return table.column("query_id").to_numpy(), seeds, scores


def open_artifacts(path: str | Path, verify: bool = True, accept_mismatch: bool = False) -> Artifacts:
    """Open an artifacts directory or URI (fetched first, ``seeder.system.storage``); its dataset may be a URI too.

    ``verify``: check the files the readers' stages recorded (``Artifacts.verify``: sizes, cheap) first.
    ``accept_mismatch``: a dataset rewritten since the artifacts were built is a warning, not an error."""
    path = fetch(path)
    manifest = read_manifest(path)
    if manifest is None:
        raise DataError(f"{path}: no artifacts manifest; run `python pipelines/preprocess.py --dataset DIR --out {path}` first")
    if manifest.get("kind") == "seeder-dataset":
        raise DataError(
            f"{path}: this is a dataset, not artifacts: run pipelines/preprocess.py --dataset {path} --out ARTIFACTS "
            f"and pass ARTIFACTS instead"
        )
    missing = [key for key in ("dataset", "config") if key not in manifest]
    if missing:
        raise DataError(
            f"{path}: its manifest.json has no {' or '.join(missing)}, so it is not an artifacts directory (kind "
            f"{manifest.get('kind', 'unknown')!r}); give the --out of pipelines/preprocess.py"
        )
    artifacts = Artifacts(path=path, manifest=manifest, accept_mismatch=accept_mismatch)
    if verify:
        artifacts.verify()
    return artifacts
