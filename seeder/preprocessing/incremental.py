"""Preprocessing a new dataset version from its parent's artifacts: only what the change reaches.

``seeder import ... --update`` writes a new version of a dataset with stable ids and its parent's
fingerprint (``seeder.data.update``). ``pipelines/preprocess.py --update PARENT_ARTIFACTS`` then reuses the
parent's artifacts and recomputes, per stage:

- embed: the texts (node, relation, question) that are new or differ from the parent's text of the
  same id; every other row is the parent's;
- features: the same rows, projected with the parent's PCA (kept, not fitted again); the rest copied;
- seeds: the questions whose seeds can change: new or edited ones, those whose entity links can change
  (they mention a name of a renamed, new or removed node, or one that a new, edited or removed question
  mentions: one regular-expression scan, no question linked twice), those whose seeds include a node
  whose features changed, and those where a node whose features
  changed now scores at least their last dense seed's score (one product of the questions with the
  changed nodes' features, never with every node). An ANN index, or a strategy that reads every node
  text, seeds every question again, unless no node text or name and no question changed: seeding
  reads no edge, so the parent's seeds are then kept whole;
- golden paths and the prior (``expand.relation_score: learned``): kept together, since the paths are
  the kept prior's training data (their manifest records the graph they were searched on). A refit
  searches again the paths of the training questions that are new or edited, whose seeds changed, or
  whose seeds lie within ``hops - 1`` edges of an added or removed edge (the nodes whose adjacency the
  path search reads), or of every training question where the paths were kept from an older version;
  it fits the prior again and re-extracts every subgraph, since the prior scores every expansion;
- subgraphs: the questions whose bounded region touches the change. The extraction reads the adjacency
  of the nodes it expanded (hop < K), scores their neighbours, and collects the edges among its nodes.
  So a question is re-extracted when an expanded node is or neighbours a node whose features changed,
  when any of its nodes is such a node, when its seeds changed, or when its row (text, split, answers)
  changed. A changed edge re-extracts it when an expanded node is an endpoint; with the cosine relation
  score, only when the edge can change what it selects (``regions_changed_by_edges``: a score of one
  of its nodes, its induced edges, or a candidate that reaches a hop's lowest kept score). The parent's
  subgraph rows say which nodes each extraction expanded (``hop``) and what each hop kept (``score``),
  so the tests are gathers over them.

Without a PCA (``reduce.dim: 0``) and with the prior refitted or not learned, the result is a full run's
on the new version, bit for bit with a deterministic encoder (the hash encoder; a batched neural encoder
may differ in the last bits between batches). With a PCA, a full run fits it again on the new version,
so its features, and everything after them, differ; the update keeps the parent's PCA, which keeps the
new rows in the space a model trained on the parent reads.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seeder.config import SeederConfig, from_dict, load_config, parse_overrides, to_dict
from seeder.data.ragged import positions_within, ranges, segment_ids
from seeder.data.store import KnowledgeGraph
from seeder.data.subgraphs import SubgraphSet
from seeder.features import bfloat16
from seeder.features.embed import PCA, apply_pca
from seeder.preprocessing import stages as pp
from seeder.preprocessing.artifacts import Artifacts, read_seed_table
from seeder.preprocessing.edge_changes import changed_edges, regions_changed_by_edges
from seeder.retrieve.paths import sampled_slices
from seeder.retrieve.seeds import EntityLinker, given_seeds, normalise_texts, resolve_search, seed_queries
from seeder.system.io import DataError, fingerprint_json, read_manifest
from seeder.system.threads import intra_op_threads

SCORE_MARGIN = 1e-5
"""A changed node within this of a question's last dense seed score counts as able to enter its seeds:
the screen is a float32 product, the seeds' scores exact per pair, and a tie goes to the smaller id."""
KEPT_SHARD = "part-kept-{:06d}.parquet"
"""Rows copied from the parent into a stage of query shards (golden paths, subgraphs); the name sorts
after no computed shard and matches the readers' ``part-*.parquet`` and ``*.parquet``."""
KEPT_ROWS = 100_000


# ---------------------------------------------------------------------------------------------------
# What changed between two versions


@dataclass
class VersionDiff:
    """What differs between a parent dataset and its new version, per row, as numpy masks and maps.

    ``*_source`` gives, for each row of the new version's embed inputs (``stages.embed_inputs``: nodes
    by id, relations then inverses, questions by id), the row of the parent's inputs with the same id
    and the same text, or -1 where the text is new or changed (those are embedded again)."""

    node_source: np.ndarray
    relation_source: np.ndarray
    query_source: np.ndarray
    query_ids: np.ndarray  # the new version's question ids, ascending
    parent_query_ids: np.ndarray
    query_parent_row: np.ndarray  # row of each question in the parent's id order, -1 for new ones
    query_same: np.ndarray  # bool: same id, text, split and answers as in the parent
    touched: np.ndarray  # bool [N]: endpoints of added or removed edges
    renamed: np.ndarray  # bool [N]: a name that differs from the parent's (new nodes included)
    counts: dict[str, int] = field(default_factory=dict)
    added_edges: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))  # (src, relation, dst) in the new ids
    removed_edges: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))  # (src, relation, dst) in the parent's

    @property
    def changed_nodes(self) -> np.ndarray:
        """bool [N]: nodes whose features change (new, edited or removed texts)."""
        return self.node_source < 0


def _same_strings(new: pa.Array, old: pa.Array, rows: np.ndarray) -> np.ndarray:
    """``new[i] == old[rows[i]]`` for rows >= 0, False elsewhere (Arrow kernels, no Python loop)."""
    out = np.zeros(len(new), dtype=bool)
    valid = np.flatnonzero(rows >= 0)
    if valid.size:
        picked_new = new.take(pa.array(valid))
        picked_old = old.take(pa.array(rows[valid]))
        out[valid] = pc.fill_null(pc.equal(picked_new, picked_old), False).to_numpy(zero_copy_only=False)
    return out


def _same_file(kg: KnowledgeGraph, parent: KnowledgeGraph, name: str) -> bool:
    """Whether both versions' manifests record the same content fingerprint for table file ``name``: then
    its rows are the parent's and need no comparison (an edge-only change leaves 1M node texts unread)."""
    ours, theirs = kg.manifest["fingerprints"].get(name), parent.manifest["fingerprints"].get(name)
    return ours is not None and ours == theirs


def _answer_lists_equal(new_ptr, new_flat, old_ptr, old_flat, rows: np.ndarray, old_rows: np.ndarray) -> np.ndarray:
    """Per pair (rows[i] of new, old_rows[i] of old): the same answer list, in order."""
    n_len = np.diff(new_ptr)[rows]
    o_len = np.diff(old_ptr)[old_rows]
    same = n_len == o_len
    pick = np.flatnonzero(same & (n_len > 0))
    if pick.size:
        lengths = n_len[pick]
        owner = np.repeat(pick, lengths)
        within = positions_within(lengths)
        equal = new_flat[new_ptr[rows[owner]] + within] == old_flat[old_ptr[old_rows[owner]] + within]
        bad = np.bincount(owner[~equal], minlength=len(rows)) > 0
        same &= ~bad
    return same


def diff_versions(parent: KnowledgeGraph, kg: KnowledgeGraph) -> VersionDiff:
    """Compare a dataset version with its parent row by row (ids are stable across versions)."""
    n, n_parent = kg.num_nodes, parent.num_nodes
    if n < n_parent:
        raise DataError(
            f"{kg.path}: has {n:,} nodes, fewer than its parent's {n_parent:,}; an update keeps every node id, "
            f"so this is not a version written by `seeder import ... --update`"
        )
    node_rows = np.where(np.arange(n) < n_parent, np.arange(n), -1)
    if _same_file(kg, parent, "nodes.parquet"):
        same_text = same_name = node_rows >= 0
    else:
        new_nodes, old_nodes = kg.table("nodes", ["name", "text"]), parent.table("nodes", ["name", "text"])
        same_text = _same_strings(new_nodes.column("text").combine_chunks(), old_nodes.column("text").combine_chunks(), node_rows)
        same_name = _same_strings(new_nodes.column("name").combine_chunks(), old_nodes.column("name").combine_chunks(), node_rows)
    node_source = np.where(same_text, node_rows, -1)

    r, r_parent = kg.num_relations, parent.num_relations
    base = np.arange(r)
    rel_rows = np.concatenate([np.where(base < r_parent, base, -1), np.where(base < r_parent, base + r_parent, -1)])
    same_rel = _same_strings(pa.array(kg.relation_texts, pa.string()), pa.array(parent.relation_texts, pa.string()), rel_rows)
    relation_source = np.where(same_rel, rel_rows, -1)

    new_q = kg.table("queries", ["id", "text", "split", "answers"]).sort_by("id")
    old_q = parent.table("queries", ["id", "text", "split", "answers"]).sort_by("id")
    ids, old_ids = new_q.column("id").to_numpy(), old_q.column("id").to_numpy()
    pos = np.minimum(np.searchsorted(old_ids, ids), max(len(old_ids) - 1, 0))
    found = (old_ids[pos] == ids) if len(old_ids) else np.zeros(len(ids), dtype=bool)
    q_rows = np.where(found, pos, -1)
    same_q_text = _same_strings(new_q.column("text").combine_chunks(), old_q.column("text").combine_chunks(), q_rows)
    query_source = np.where(same_q_text, q_rows, -1)
    same_split = _same_strings(new_q.column("split").combine_chunks(), old_q.column("split").combine_chunks(), q_rows)
    new_ptr, new_flat = pp.answer_csr(new_q)
    old_ptr, old_flat = pp.answer_csr(old_q)
    matched = np.flatnonzero(found)
    same_answers = np.zeros(len(ids), dtype=bool)
    same_answers[matched] = _answer_lists_equal(new_ptr, new_flat, old_ptr, old_flat, matched, q_rows[matched])
    query_same = same_q_text & same_split & same_answers

    if all(_same_file(kg, parent, f"adjacency/{name}.npy") for name in ("indptr", "neighbors", "relations")):
        added_edges = removed_edges = np.zeros((0, 3), np.int64)
    else:
        added_edges, removed_edges = changed_edges(parent, kg)
    touched = np.zeros(n, dtype=bool)
    touched[added_edges[:, [0, 2]].ravel()] = True
    touched[removed_edges[:, [0, 2]].ravel()] = True
    counts = {
        "nodes_changed": int((node_source < 0).sum()),
        "relations_changed": int((relation_source < 0).sum()),
        "queries_changed": int((~query_same).sum()),
        "queries_removed": int(len(old_ids) - found.sum()),
        "edges_added": len(added_edges),
        "edges_removed": len(removed_edges),
        "nodes_touched": int(touched.sum()),
    }
    return VersionDiff(
        node_source=node_source,
        relation_source=relation_source,
        query_source=query_source,
        query_ids=ids,
        parent_query_ids=old_ids,
        query_parent_row=q_rows,
        query_same=query_same,
        touched=touched,
        renamed=~same_name,
        counts=counts,
        added_edges=added_edges,
        removed_edges=removed_edges,
    )


# ---------------------------------------------------------------------------------------------------
# Checks: the parent artifacts belong to the dataset's parent, and the configs agree


def check_parent(kg: KnowledgeGraph, parent: Artifacts) -> None:
    """Refuse artifacts that are not those of ``kg``'s parent version (one line naming the fix)."""
    record = kg.manifest.get("parent") or {}
    if not record.get("fingerprint"):
        raise DataError(
            f"{kg.path}/manifest.json: records no parent version; --update needs a dataset written by "
            f"`seeder import ... --update` (or drop --update for a full run)"
        )
    built_from = parent.dataset_fingerprint
    if built_from != record["fingerprint"]:
        raise DataError(
            f"{parent.path}/manifest.json: built from dataset fingerprint {built_from}, but {kg.path}'s parent is "
            f"{record['fingerprint']} ({record.get('path', '?')}); pass the artifacts of that parent to --update, "
            f"or drop --update for a full run"
        )
    missing = [s for s in ("embed", "features", "seeds", "subgraphs") if read_manifest(parent.path / s) is None]
    if missing:
        raise DataError(
            f"{parent.path}: stage {missing[0]} is missing or incomplete; finish the parent's preprocessing "
            f"({parent.rerun_hint()}) before --update"
        )


def check_same_config(config: SeederConfig, parent: Artifacts, where: str) -> None:
    """Refuse a config whose stages would differ from the parent's (``where`` names the config's source)."""
    ours = pp.stage_fingerprints(config, "update")
    theirs = pp.stage_fingerprints(parent.config, "update")
    differ = [name for name in theirs if ours.get(name) != theirs[name]] + [name for name in ours if name not in theirs]
    if differ:
        raise DataError(
            f"{where}: differs from the config of {parent.path} in the {differ[0]} stage, so its rows cannot be "
            f"reused; drop --config and the overrides to use the parent's config, or run a full preprocessing without --update"
        )


def update_fingerprints(config: SeederConfig, kg: KnowledgeGraph, parent: Artifacts, kept: list[str]) -> dict[str, str]:
    """Stage fingerprints of an update: a full run's, tied to the parent artifacts and to what was kept
    from them (``pca``, ``prior``), so that neither a full run nor another parent's update passes for it."""
    full = pp.stage_fingerprints(config, kg.fingerprint, kg.num_nodes)
    return {
        name: fingerprint_json({"stage": name, "full": fp, "parent": parent.fingerprint, "kept": sorted(kept)})
        for name, fp in full.items()
    }


# ---------------------------------------------------------------------------------------------------
# Embed and features


def texts_to_embed(kg: KnowledgeGraph, diff: VersionDiff) -> pa.Table:
    """(kind, row, id, text) of the rows whose text the parent has not embedded, as the embed stage's
    encoder pipeline takes them (``stages.embed_text_table``)."""
    inputs = pp.embed_inputs(kg)
    sources = {"node": diff.node_source, "relation": diff.relation_source, "query": diff.query_source}
    parts = []
    for kind_index, kind in enumerate(pp.KINDS):
        ids, texts = inputs[kind]
        rows = np.flatnonzero(sources[kind] < 0)
        parts.append(
            pa.table(
                {
                    "kind": pa.array(np.full(len(rows), kind_index, np.int8)),
                    "row": pa.array(rows.astype(np.int64)),
                    "id": pa.array(ids[rows]),
                    "text": texts.take(pa.array(rows, pa.int64())),
                }
            )
        )
    return pa.concat_tables(parts)


class EmbeddedRows:
    """Embeddings of the rows ``texts_to_embed`` named, collected from batches in any order."""

    def __init__(self, table: pa.Table):
        self.kind = table.column("kind").to_numpy()
        self.row = table.column("row").to_numpy()
        self.emb: np.ndarray | None = None
        self.seen = np.zeros(len(self.row), dtype=bool)
        self.key = self.kind.astype(np.int64) * (1 << 40) + self.row
        self.order = np.argsort(self.key)

    def add(self, kind: np.ndarray, row: np.ndarray, embedding: np.ndarray) -> None:
        key = np.asarray(kind, dtype=np.int64) * (1 << 40) + np.asarray(row, dtype=np.int64)
        at = self.order[np.searchsorted(self.key[self.order], key)]
        if self.emb is None:
            self.emb = np.zeros((len(self.row), embedding.shape[1]), dtype=np.float32)
        self.emb[at] = embedding
        self.seen[at] = True

    def of(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, embeddings) of one kind, rows ascending."""
        if not self.seen.all():
            raise DataError(f"embed: the encoder returned {int(self.seen.sum())} of {len(self.seen)} changed texts")
        pick = np.flatnonzero(self.kind == pp.KINDS.index(kind))
        pick = pick[np.argsort(self.row[pick])]
        width = self.emb.shape[1] if self.emb is not None else 0
        return self.row[pick], (self.emb[pick] if self.emb is not None else np.zeros((0, width), np.float32))


def _write_shard(path: Path, ids: np.ndarray, emb: np.ndarray) -> None:
    pp.write_table_atomic(pa.table({"id": pa.array(ids), "embedding": pp.embedding_column(emb)}), path)


def _link_or_copy(src: Path, dst: Path) -> None:
    """A parent's file, unchanged, in a new stage: a hard link where the filesystem allows it."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write_embed(
    parent_embed: Path, out: Path, kg: KnowledgeGraph, diff: VersionDiff, embedded: EmbeddedRows, shard_rows: int
) -> dict:
    """The embed stage of the new version in ``out``: the parent's rows where the text is the same,
    the new embeddings elsewhere, in the parent's shard layout (``shard_rows``). A node shard with no
    changed row is the parent's file, linked."""
    inputs = pp.embed_inputs(kg)
    (out / "nodes").mkdir(parents=True, exist_ok=True)
    (out / "queries").mkdir(parents=True, exist_ok=True)
    rows, emb = embedded.of("node")
    node_ids = inputs["node"][0]
    width = None
    for block in range(-(-len(node_ids) // shard_rows)):  # one step per shard, not per row
        lo, hi = block * shard_rows, min((block + 1) * shard_rows, len(node_ids))
        src = diff.node_source[lo:hi]
        parent_file = parent_embed / "nodes" / f"part-{block:06d}.parquet"
        target = out / "nodes" / f"part-{block:06d}.parquet"
        if parent_file.exists() and (src >= 0).all() and np.array_equal(src, np.arange(lo, hi)):
            if pq.ParquetFile(parent_file).metadata.num_rows == hi - lo:
                _link_or_copy(parent_file, target)
                continue
        block_emb = None
        if parent_file.exists():
            p_ids, p_emb = pp.read_embedding_table(parent_file)
            width = p_emb.shape[1]
            block_emb = np.zeros((hi - lo, width), np.float32)
            keep = src >= 0
            block_emb[keep] = p_emb[np.searchsorted(p_ids, src[keep])]
        sel = (rows >= lo) & (rows < hi)
        if sel.any():
            if block_emb is None:
                block_emb = np.zeros((hi - lo, emb.shape[1]), np.float32)
            block_emb[rows[sel] - lo] = emb[sel]
        _write_shard(target, node_ids[lo:hi], block_emb)

    relations = np.load(parent_embed / "relations.npy")
    new_rel = np.zeros((len(diff.relation_source), relations.shape[1]), np.float32)
    keep = diff.relation_source >= 0
    new_rel[keep] = relations[diff.relation_source[keep]]
    r_rows, r_emb = embedded.of("relation")
    if len(r_rows):  # with nothing embedded (a change of edges only) the batch has no width to assign
        new_rel[r_rows] = r_emb
    np.save(out / "relations.npy", new_rel)

    query_ids = inputs["query"][0]
    q_rows, q_emb = embedded.of("query")
    if not len(q_rows) and _link_unchanged(parent_embed / "queries", out / "queries", diff.query_source, shard_rows):
        return _embed_info(inputs, new_rel, embedded)
    parent_queries = pp.read_embeddings(parent_embed / "queries", diff.parent_query_ids)
    new_q = np.zeros((len(query_ids), new_rel.shape[1]), np.float32)
    keep = diff.query_source >= 0
    if parent_queries is not None:
        new_q[keep] = parent_queries[diff.query_source[keep]]
    if len(q_rows):
        new_q[q_rows] = q_emb
    for block, lo in enumerate(range(0, len(query_ids), shard_rows)):
        _write_shard(out / "queries" / f"part-{block:06d}.parquet", query_ids[lo : lo + shard_rows], new_q[lo : lo + shard_rows])
    return _embed_info(inputs, new_rel, embedded)


def _embed_info(inputs: dict, relations: np.ndarray, embedded: EmbeddedRows) -> dict:
    return {
        "dim": int(relations.shape[1]),
        "counts": {k: int(len(v[0])) for k, v in inputs.items()},
        "embedded": {kind: int(len(embedded.of(kind)[0])) for kind in pp.KINDS},
    }


def _link_unchanged(parent_dir: Path, out_dir: Path, source: np.ndarray, shard_rows: int) -> bool:
    """Link every shard of ``parent_dir`` into ``out_dir`` when the new rows are the parent's, in order,
    in the same shard layout, as when no question changed. False, and nothing linked, otherwise."""
    files = sorted(parent_dir.glob("part-*.parquet"))
    layout = [min(shard_rows, len(source) - lo) for lo in range(0, len(source), shard_rows)]
    if not np.array_equal(source, np.arange(len(source))) or len(files) != len(layout):
        return False
    if [pq.ParquetFile(f).metadata.num_rows for f in files] != layout:
        return False
    for f in files:
        _link_or_copy(f, out_dir / f.name)
    return True


def _embedding_rows(embed_dir: Path, expected_ids: np.ndarray, rows: np.ndarray, shard_rows: int) -> np.ndarray:
    """The embeddings of ``rows`` (ascending row numbers of node shards of ``shard_rows``), reading only
    the shards that hold them."""
    out = None
    for block in np.unique(rows // shard_rows).tolist():  # one step per shard that holds a changed row
        ids, emb = pp.read_embedding_table(embed_dir / f"part-{block:06d}.parquet")
        if out is None:
            out = np.zeros((len(rows), emb.shape[1]), np.float32)
        sel = np.flatnonzero(rows // shard_rows == block)
        out[sel] = emb[np.searchsorted(ids, expected_ids[rows[sel]])]
    return out if out is not None else np.zeros((0, 0), np.float32)


def write_features(
    parent_features: Path,
    embed_dir: Path,
    out: Path,
    kg: KnowledgeGraph,
    diff: VersionDiff,
    config: SeederConfig,
    shard_rows: int,
) -> dict:
    """The features stage of the new version: the parent's rows where the text is the same, the new
    embeddings projected with the parent's PCA (``pca.npz`` kept; none with ``reduce.dim: 0``) elsewhere."""
    n = kg.num_nodes
    copy = bfloat16.applies(n, config.reduce.bfloat16_from_nodes)
    if copy != (parent_features / bfloat16.FILE_NAME).exists():
        # the filter's rows would change for every subgraph, which the update does not redo
        raise DataError(
            f"{parent_features}: the new version has {n:,} nodes, across reduce.bfloat16_from_nodes="
            f"{config.reduce.bfloat16_from_nodes:,} from its parent, so K-HOP's filter would read other node rows; "
            f"run a full preprocessing of the new version without --update"
        )
    pca = PCA.load(parent_features / "pca.npz") if config.reduce.dim else None
    if pca is not None:
        shutil.copyfile(parent_features / "pca.npz", out / "pca.npz")
    parent_nodes = np.load(parent_features / "node.npy", mmap_mode="r")
    width = parent_nodes.shape[1]
    changed = np.flatnonzero(diff.node_source < 0)
    if changed.size == 0 and n == len(parent_nodes):  # every row the parent's: its files, linked
        for name in ("node.npy", *([bfloat16.FILE_NAME] if copy else [])):
            _link_or_copy(parent_features / name, out / name)
    else:
        nodes = np.lib.format.open_memmap(out / "node.npy", mode="w+", dtype=np.float32, shape=(n, width))
        step = 1 << 18
        for lo in range(0, len(parent_nodes), step):  # a block copy: at most a few steps per million rows
            hi = min(lo + step, len(parent_nodes))
            nodes[lo:hi] = parent_nodes[lo:hi]
        if changed.size:
            emb = _embedding_rows(embed_dir / "nodes", np.arange(n, dtype=np.int64), changed, shard_rows)
            with intra_op_threads(1):
                nodes[changed] = apply_pca(emb, pca)
        nodes.flush()
        del nodes
        if copy:
            bfloat16.write_copy(out)
    relations = np.load(embed_dir / "relations.npy")
    queries = pp.read_embeddings(embed_dir / "queries", diff.query_ids)
    # Unchanged rows keep the parent's bits, so that rows kept downstream read what they were built on.
    for name, embedded, source in (("relation", relations, diff.relation_source), ("query", queries, diff.query_source)):
        parent_rows = np.load(parent_features / f"{name}.npy", mmap_mode="r")
        rows = np.zeros((len(source), width), np.float32)
        keep = source >= 0
        rows[keep] = parent_rows[source[keep]]
        if (~keep).any():
            with intra_op_threads(1):
                rows[~keep] = apply_pca(embedded[~keep], pca)
        np.save(out / f"{name}.npy", rows)
    np.save(out / "query_ids.npy", diff.query_ids)
    parent_info = (read_manifest(parent_features) or {}).get("info", {})
    return {
        "dim": int(width),
        "input_dim": int(relations.shape[1]),
        "explained_variance": parent_info.get("explained_variance"),
        "pca_sample": parent_info.get("pca_sample", 0),
        "pca": "kept from the parent artifacts" if pca is not None else None,
        "rows_projected": {
            "node": int(changed.size),
            "relation": int((diff.relation_source < 0).sum()),
            "query": int((diff.query_source < 0).sum()),
        },
    }


# ---------------------------------------------------------------------------------------------------
# Seeds


def _padded(lists: list[np.ndarray], width: int) -> np.ndarray:
    """Ragged id lists as [len(lists), width] int64, padded with -1 (longer lists cut)."""
    lengths = np.fromiter((min(len(x), width) for x in lists), dtype=np.int64, count=len(lists))
    out = np.full((len(lists), width), -1, dtype=np.int64)
    if lengths.sum():
        flat = np.concatenate([x[:width] for x in lists]).astype(np.int64)
        owner = np.repeat(np.arange(len(lists)), lengths)
        within = positions_within(lengths)
        out[owner, within] = flat
    return out


def names_to_relink(
    kg: KnowledgeGraph, parent_kg: KnowledgeGraph, diff: VersionDiff, linker: EntityLinker, texts: pa.Array
) -> set[str]:
    """Normalised names whose entity links can differ between the parent's linker and ``linker`` (the new
    version's): the old and new names of renamed, new or removed nodes (which nodes a name links to
    changes), and the names that new, edited or removed questions mention (their query counts, the
    linker's IDF, change). A question that mentions none of them links exactly as in the parent.
    ``texts``: the new version's question texts, by id."""
    ids = np.flatnonzero(diff.renamed)
    old_ids = ids[ids < parent_kg.num_nodes]
    names = set(normalise_texts(kg.node_names.take(pa.array(ids))).to_pylist())
    names |= set(normalise_texts(parent_kg.node_names.take(pa.array(old_ids))).to_pylist())
    kept_parent_rows = np.zeros(len(diff.parent_query_ids), dtype=bool)
    kept_parent_rows[diff.query_source[diff.query_source >= 0]] = True
    new_texts = texts.take(pa.array(np.flatnonzero(diff.query_source < 0)))
    gone_texts = (
        parent_kg.table("queries", ["id", "text"]).sort_by("id").column("text").take(pa.array(np.flatnonzero(~kept_parent_rows)))
    )
    # A name only the parent knew is a renamed or removed node's, already in ``names``.
    names |= linker.mentioned_names(pa.concat_arrays([new_texts, gone_texts.combine_chunks()]))
    names.discard("")
    return names


NAMES_PER_PATTERN = 512
"""Names per regular expression in ``mention_any``: RE2 bounds a compiled pattern's memory."""


def mention_any(normalised_texts: pa.Array, names: set[str]) -> np.ndarray:
    """bool per text: whether a normalised text holds one of the normalised ``names`` as whole words.
    Normalised strings hold only letters, digits and single spaces, so a name needs no escaping."""
    found = np.zeros(len(normalised_texts), dtype=bool)
    ordered = sorted(names)
    for lo in range(0, len(ordered), NAMES_PER_PATTERN):
        pattern = "(?:^| )(?:" + "|".join(ordered[lo : lo + NAMES_PER_PATTERN]) + ")(?: |$)"
        found |= pc.match_substring_regex(normalised_texts, pattern=pattern).to_numpy(zero_copy_only=False)
    return found


def _pad_to(array: np.ndarray, width: int, fill) -> np.ndarray:
    if array.shape[1] >= width:
        return array[:, :width]
    return np.concatenate([array, np.full((len(array), width - array.shape[1]), fill, array.dtype)], axis=1)


def parent_seed_rows(parent_seeds: Path, diff: VersionDiff, k0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parent's seeds of the new version's questions, [Q, k0] (-1 / -inf where the parent has none),
    and which questions the parent seeded."""
    p_ids, p_seeds, p_scores = read_seed_table(parent_seeds)
    p_seeds, p_scores = _pad_to(p_seeds, k0, -1), _pad_to(p_scores, k0, -np.inf)
    seeds = np.full((len(diff.query_ids), k0), -1, np.int64)
    scores = np.full((len(diff.query_ids), k0), -np.inf, np.float32)
    pos = np.minimum(np.searchsorted(p_ids, diff.query_ids), max(len(p_ids) - 1, 0))
    has = (p_ids[pos] == diff.query_ids) if len(p_ids) else np.zeros(len(diff.query_ids), dtype=bool)
    seeds[has], scores[has] = p_seeds[pos[has]], p_scores[pos[has]]
    return seeds, scores, has


def seeds_to_recompute(
    kg: KnowledgeGraph,
    parent_kg: KnowledgeGraph,
    config: SeederConfig,
    diff: VersionDiff,
    node_features: np.ndarray,
    query_features: np.ndarray,
    old_seeds: np.ndarray,
    old_scores: np.ndarray,
    has_old: np.ndarray,
    linker: EntityLinker | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """bool [Q]: the questions whose seeds can differ from the parent's (see the module's docstring),
    and how many for each reason. ``linker``: the new version's, when the strategy links entities."""
    cfg = config.seed
    k0 = cfg.k0
    fresh = (diff.query_source < 0) | ~has_old
    relinked = np.zeros(len(fresh), dtype=bool)
    dense_part = np.full(len(fresh), cfg.strategy != "entity")
    if linker is not None:
        texts = kg.table("queries", ["id", "text"]).sort_by("id").column("text").combine_chunks()
        names = names_to_relink(kg, parent_kg, diff, linker, texts)
        if names:
            relinked = mention_any(normalise_texts(texts), names) & ~fresh
        # A question with k0 links takes no dense seed. The new linker's links are the parent's for
        # every question not relinked (the parent's linker is never built).
        links = _padded(linker.link(texts), max(cfg.entity_max, 1))
        dense_part &= (links >= 0).sum(axis=1) < k0
    elif cfg.strategy == "given":
        same = np.flatnonzero(~fresh)
        given = _padded(given_seeds(kg, diff.query_ids, cfg.given_attribute), 1)
        relinked[same] = (_padded(given_seeds(parent_kg, diff.query_ids[same], cfg.given_attribute), 1) != given[same]).any(
            axis=1
        )
        dense_part &= (given >= 0).sum(axis=1) < k0
    changed = diff.changed_nodes
    holds_changed = ((old_seeds >= 0) & changed[np.maximum(old_seeds, 0)]).any(axis=1)
    # A dense seed row can take a changed node where that node scores at least the row's last score.
    outscored = np.zeros(len(fresh), dtype=bool)
    rows = np.flatnonzero(dense_part & ~fresh & ~relinked & ~holds_changed)
    short = rows[old_seeds[rows, k0 - 1] < 0]  # fewer than k0 seeds: any node could enter
    outscored[short] = True
    rows = rows[old_seeds[rows, k0 - 1] >= 0]
    changed_ids = np.flatnonzero(changed)
    if rows.size and changed_ids.size:
        candidates = np.ascontiguousarray(node_features[changed_ids], dtype=np.float32)
        threshold = old_scores[rows, k0 - 1] - SCORE_MARGIN
        for lo in range(0, len(rows), 4096):  # bounded memory: 4,096 questions at a time
            block = rows[lo : lo + 4096]
            best = (np.asarray(query_features[block], dtype=np.float32) @ candidates.T).max(axis=1)
            outscored[block] = best >= threshold[lo : lo + 4096]
    redo = fresh | relinked | holds_changed | outscored
    reasons = {
        "new_or_edited": int(fresh.sum()),
        "links_can_change": int((relinked & ~fresh).sum()),
        "seed_changed": int((holds_changed & ~fresh & ~relinked).sum()),
        "outscored": int((outscored & ~fresh & ~relinked & ~holds_changed).sum()),
    }
    return redo, reasons


def changed_seeds(parent_seeds: Path, seeds_file: Path, diff: VersionDiff, k0: int) -> tuple[np.ndarray, np.ndarray]:
    """The new version's seeds [Q, k0] (for ``diff.query_ids``) and the ids of the questions whose seeds
    or seed scores differ from the parent's (new questions included)."""
    old_seeds, old_scores, has_old = parent_seed_rows(parent_seeds, diff, k0)
    _, seeds, scores = read_seed_table(seeds_file)
    seeds, scores = _pad_to(seeds, k0, -1), _pad_to(scores, k0, -np.inf)
    differ = ~has_old | (seeds != old_seeds).any(axis=1) | (scores != old_scores).any(axis=1)
    return seeds, diff.query_ids[differ]


def seeding_inputs_unchanged(diff: VersionDiff) -> bool:
    """Whether the seeds stage reads exactly what it read for the parent: every node's text and name
    and every question's id and text. Seeding reads no edge, so an ANN index built again and its
    recall checks would repeat the parent's run; its seeds can be kept whole."""
    same_questions = len(diff.query_ids) == len(diff.parent_query_ids) and bool((diff.query_source >= 0).all())
    return same_questions and not diff.changed_nodes.any() and not diff.renamed.any()


def update_seeds(
    features_dir: Path,
    out: Path,
    kg: KnowledgeGraph,
    parent_kg: KnowledgeGraph,
    parent_seeds: Path,
    diff: VersionDiff,
    config: SeederConfig,
    dense_blocks: Callable | None = None,
) -> dict[str, Any]:
    """The seeds stage of the new version: the parent's seeds, and those of ``seeds_to_recompute`` seeded
    again as a full run seeds them (``seed_queries`` with the new version's linker and exact dense search;
    ``dense_blocks(features, search, index)`` as in ``stages.run_seeds``). Strategies whose seeds read
    every node text at once (``bm25``, ``hybrid``) and an ANN index seed every question again, unless
    no input of seeding changed (``seeding_inputs_unchanged``)."""
    cfg = config.seed
    node_features = np.load(features_dir / "node.npy", mmap_mode="r")
    query_features = np.load(features_dir / "query.npy", mmap_mode="r")
    old_seeds, old_scores, has_old = parent_seed_rows(parent_seeds, diff, cfg.k0)
    search = resolve_search(cfg, len(node_features), len(query_features)) if cfg.strategy not in ("entity", "hybrid") else "exact"
    if cfg.strategy in ("bm25", "hybrid") or search != "exact":
        if seeding_inputs_unchanged(diff):  # then old_seeds holds every question's
            shutil.copyfile(parent_seeds, out / "seeds.parquet")
            kept = {"kept": "no node text, node name or question text changed"}
            return {**pp.seed_stage_info(old_seeds, cfg, search), "recomputed": 0, "why": kept}
        info = pp.run_seeds(features_dir, out, kg, config, dense_blocks=dense_blocks)
        q_ids, seeds, scores = read_seed_table(out / "seeds.parquet")
        seeds, scores = _pad_to(seeds, cfg.k0, -1), _pad_to(scores, cfg.k0, -np.inf)
        return {**info, "recomputed": int(len(q_ids)), "why": {"all": f"strategy {cfg.strategy}, search {search}"}}
    linker = EntityLinker(kg, cfg) if cfg.strategy in ("entity", "dense+entity") else None
    redo, reasons = seeds_to_recompute(
        kg, parent_kg, config, diff, node_features, query_features, old_seeds, old_scores, has_old, linker
    )
    seeds, scores = old_seeds.copy(), old_scores.copy()
    rows = np.flatnonzero(redo)
    if rows.size:
        texts = None
        if cfg.strategy not in ("dense", "given"):
            all_texts = kg.table("queries", ["id", "text"]).sort_by("id").column("text")
            texts = all_texts.take(pa.array(rows)).to_pylist()
        dense = None if dense_blocks is None else (lambda features: dense_blocks(features, "exact", None))
        new_seeds, new_scores = seed_queries(
            kg,
            config,
            np.asarray(query_features[rows]),
            node_features,
            texts=texts,
            query_ids=diff.query_ids[rows],
            linker=linker,
            search="exact",
            dense=dense,
        )
        seeds[rows], scores[rows] = _pad_to(new_seeds, cfg.k0, -1), _pad_to(new_scores, cfg.k0, -np.inf)
    pp.write_seed_table(out / "seeds.parquet", diff.query_ids, seeds, scores)
    return {**pp.seed_stage_info(seeds, cfg, "exact"), "recomputed": int(rows.size), "why": reasons}


# ---------------------------------------------------------------------------------------------------
# Golden paths and subgraphs: which questions the change reaches


def _neighbours(kg: KnowledgeGraph, mask: np.ndarray) -> np.ndarray:
    """bool [N]: the nodes adjacent (either direction) to a node of ``mask`` in ``kg``'s CSR."""
    ids = np.flatnonzero(mask)
    indptr = np.asarray(kg.indptr)
    starts, lengths = indptr[ids], np.diff(indptr)[ids]
    positions = ranges(starts, lengths)
    out = np.zeros(kg.num_nodes, dtype=bool)
    out[np.asarray(kg.neighbors)[positions]] = True
    return out


def _sampled_edges(kg: KnowledgeGraph, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) of every edge a capped search reads: of a node with more than ``cap``
    neighbours, only the sample that expansion and the path search take (``sampled_slices``)."""
    pos, owner = sampled_slices(np.asarray(kg.indptr), np.arange(kg.num_nodes, dtype=np.int64), cap)
    return owner, np.asarray(kg.neighbors)[pos]


def readers(kg: KnowledgeGraph, mask: np.ndarray, cap: int) -> np.ndarray:
    """bool [N]: the nodes whose capped neighbour sample holds a node of ``mask``: those whose expansion
    scores it. A hub reads only its sample, so a change next to a hub reaches few of its readers."""
    source, target = _sampled_edges(kg, cap)
    out = np.zeros(kg.num_nodes, dtype=bool)
    out[source[mask[target]]] = True
    return out


def within(kg: KnowledgeGraph, mask: np.ndarray, steps: int, cap: int | None = None) -> np.ndarray:
    """bool [N]: nodes from which a node of ``mask`` is at most ``steps`` edges away, each step along an
    edge the capped search reads (``readers``; every edge without ``cap``)."""
    reached = mask.copy()
    frontier = mask
    for _ in range(max(steps, 0)):
        nxt = (_neighbours(kg, frontier) if cap is None else readers(kg, frontier, cap)) & ~reached
        if not nxt.any():
            break
        reached |= nxt
        frontier = nxt
    return reached


def _rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """bool over ``ids``: which are in ``wanted``."""
    return np.isin(ids, wanted)


def paths_to_recompute(
    kg: KnowledgeGraph, diff: VersionDiff, config: SeederConfig, seeds: np.ndarray, seeds_changed: np.ndarray
) -> np.ndarray:
    """Ids of the training questions whose golden paths can differ from the parent's: new or edited,
    seeds changed, or a seed within ``hops - 1`` edges of an added or removed edge (the path search
    reads the capped adjacency of every node it reaches before its last hop). ``seeds`` is [Q, k0] for
    ``diff.query_ids``."""
    train = pp.train_query_ids(kg)
    rows = np.searchsorted(diff.query_ids, train)
    near = within(kg, diff.touched, config.expand.hops - 1, config.prior.neighbor_cap)
    s = seeds[rows]
    reach = ((s >= 0) & near[np.maximum(s, 0)]).any(axis=1)
    redo = ~diff.query_same[rows] | _rows_of(train, seeds_changed) | reach
    return train[redo]


def paths_searched_on(artifacts: Artifacts) -> str:
    """The fingerprint of the dataset version whose graph an artifacts' golden paths were searched on:
    its own, unless an update kept them (with the prior) from an earlier version."""
    info = (read_manifest(artifacts.path / "paths") or {}).get("info", {})
    return info.get("searched_on") or artifacts.dataset.fingerprint


def subgraphs_to_recompute(
    kg: KnowledgeGraph,
    diff: VersionDiff,
    config: SeederConfig,
    parent_subgraphs: SubgraphSet,
    seeds: np.ndarray,
    seeds_changed: np.ndarray,
    parent_kg: KnowledgeGraph | None = None,
    features_dir: Path | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Ids of the questions whose subgraphs can differ from the parent's (see the module's docstring),
    and how many for each reason. ``seeds`` is [Q, k0] for ``diff.query_ids``. With the cosine relation
    score, the parent's dataset and the new features stage, changed edges are tested edge by edge
    (``regions_changed_by_edges``) instead of by their endpoints."""
    changed = diff.changed_nodes
    by_edge = config.expand.relation_score == "cosine" and parent_kg is not None and features_dir is not None
    touched = np.zeros_like(diff.touched) if by_edge else diff.touched
    expanded_hit = touched | changed  # expanded: reads the change
    if changed.any():
        expanded_hit |= readers(kg, changed, config.expand.neighbor_cap)
    any_hit = touched | changed  # any node of the subgraph: its induced edges or its own score
    ids = diff.query_ids
    known = _rows_of(ids, parent_subgraphs.query_ids)
    fresh = ~diff.query_same | ~known
    reseeded = _rows_of(ids, seeds_changed) & ~fresh
    renamed = np.zeros(len(ids), dtype=bool)
    if config.expand.relation_score == "learned" and config.prior.wording_dim:
        # The prior reads the seeds' names around the question's wording.
        renamed = ((seeds >= 0) & diff.renamed[np.maximum(seeds, 0)]).any(axis=1) & ~fresh & ~reseeded
    nodes = parent_subgraphs.nodes
    inside = nodes < kg.num_nodes
    hit = inside & (
        any_hit[np.where(inside, nodes, 0)]
        | (expanded_hit[np.where(inside, nodes, 0)] & (parent_subgraphs.hop < config.expand.hops))
    )
    owner = segment_ids(parent_subgraphs.node_ptr)
    reached_parent = np.bincount(owner[hit], minlength=len(parent_subgraphs)) > 0
    if by_edge:
        reached_parent |= regions_changed_by_edges(
            kg, parent_kg, diff.added_edges, diff.removed_edges, diff.touched, config, parent_subgraphs, features_dir
        )
    reached = np.zeros(len(ids), dtype=bool)
    rows = np.searchsorted(parent_subgraphs.query_ids, ids[known])
    reached[known] = reached_parent[rows]
    reached &= ~fresh & ~reseeded & ~renamed
    redo = fresh | reseeded | renamed | reached
    return ids[redo], {
        "new_or_edited": int(fresh.sum()),
        "seeds_changed": int(reseeded.sum()),
        "seed_renamed": int(renamed.sum()),
        "region_touched": int(reached.sum()),
    }


def write_kept_rows(out: Path, table: pa.Table) -> int:
    """The parent's rows that the update keeps, as ``KEPT_SHARD`` files next to the computed shards."""
    for stray in Path(out).glob(KEPT_SHARD.replace("{:06d}", "*")):
        stray.unlink()
    for block, lo in enumerate(range(0, table.num_rows, KEPT_ROWS)):
        pp.write_table_atomic(table.slice(lo, KEPT_ROWS), Path(out) / KEPT_SHARD.format(block), **pp.SHARD_WRITE)
    return table.num_rows


def keep_subgraphs(parent_subgraphs: SubgraphSet, out: Path, query_ids: np.ndarray, recomputed: np.ndarray) -> int:
    """Write the parent's subgraphs of the questions in ``query_ids`` (the new version's) that are not
    ``recomputed``; returns how many."""
    keep = np.isin(parent_subgraphs.query_ids, query_ids) & ~np.isin(parent_subgraphs.query_ids, recomputed)
    return write_kept_rows(out, parent_subgraphs.take(np.flatnonzero(keep)).to_arrow())


def keep_golden_paths(parent_paths: Path, out: Path, train_ids: np.ndarray, recomputed: np.ndarray) -> int:
    """Write the parent's golden-path rows of the training questions in ``train_ids`` that are not
    ``recomputed``; returns the rows written."""
    golden = pp.read_golden_paths(parent_paths)
    qid = golden.column("query_id").to_numpy()
    keep = np.isin(qid, train_ids) & ~np.isin(qid, recomputed)
    return write_kept_rows(out, golden.filter(pa.array(keep)))


def copy_stage_files(source: Path, out: Path) -> int:
    """A parent stage's files (its manifest aside) into a new stage directory, linked where possible;
    returns how many."""
    copied = 0
    for path in sorted(Path(source).rglob("*")):
        rel = path.relative_to(source)
        if path.is_dir() or rel.as_posix() in ("manifest.json", "partial.json"):
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(path, out / rel)
        copied += 1
    return copied


def check_kept_prior(kg: KnowledgeGraph, parent: Artifacts, config: SeederConfig, refit_prior: bool) -> None:
    """A kept relation-path prior reads the parent's relations: an update that adds relations needs
    ``--refit-prior`` (one line naming it, before anything runs)."""
    added = kg.num_relations - parent.dataset.num_relations
    if config.expand.relation_score == "learned" and not refit_prior and added > 0:
        raise DataError(
            f"{kg.path}: the update adds {added} relation(s), and the relation-path prior of {parent.path} knows "
            "only the parent's; pass --refit-prior to fit it again on the updated golden paths"
        )


def check_kept_masked_prior(kg: KnowledgeGraph, parent: Artifacts, config: SeederConfig, diff: VersionDiff) -> None:
    """A kept prior that reads masked questions (``prior.question: masked``) kept what it read of the
    parent's questions: an update that adds or edits a question, or renames a node (a seed's name is
    what it masks), needs ``--refit-prior``."""
    if config.prior.question != "masked":
        return
    questions, renamed = int((~diff.query_same).sum()), int(diff.renamed.sum())
    if questions or renamed:
        raise DataError(
            f"{kg.path}: the update changes {questions:,} question(s) and renames {renamed:,} node(s), and the "
            f"relation-path prior of {parent.path} reads masked questions (prior.question: masked) as they were; "
            "pass --refit-prior to read them again"
        )


def parent_record(parent: Artifacts) -> dict[str, Any]:
    """What an update records of its parent artifacts, with ``features_lineage``: the features
    fingerprints of the parent and of every artifacts version it was updated from. Their PCA is this
    update's, so a model trained on any of them ranks these artifacts (``serving.retriever.check_compatible``)."""
    grand = (parent.manifest.get("update") or {}).get("parent") or {}
    return {
        "path": str(parent.path),
        "fingerprint": parent.fingerprint,
        "dataset_fingerprint": parent.dataset_fingerprint,
        "config": fingerprint_json(to_dict(parent.config)),
        "features_lineage": [(parent.manifest.get("fingerprints") or {}).get("features"), *grand.get("features_lineage", [])],
    }


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def update_config(parent: Artifacts, path: str | None, overrides: list[str]) -> SeederConfig:
    """The config of an update: the parent's resolved config (derived choices included) with the dotted
    ``overrides``, or the YAML file at ``path`` with them; refused where a stage would differ from the
    parent's (``check_same_config``)."""

    if path is not None:
        config = load_config(path, overrides)
    else:
        config = from_dict(SeederConfig, _merged(to_dict(parent.config), parse_overrides(overrides)))
    where = path if path is not None else ("the overrides " + " ".join(overrides) if overrides else str(parent.path))
    check_same_config(config, parent, where)
    pp.check_config(config)
    return config
