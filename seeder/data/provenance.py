"""Where a triple came from: its row in the dataset's edges and, where the importer kept it, its input
file and row there, the dataset version that read that file, and the IRIs of an RDF import.

A retrieved triple is known by (head, relation, tail) ids. ``EdgeIndex`` finds its row in
``edges.parquet`` by a binary search over the edges' sorted keys, for all of a batch's triples at once,
and ``sources`` turns the rows into one small dict per triple, e.g.
``{"dataset": "3f9c...", "edge": 1041, "file": "kb.txt", "line": 1042}`` or, from RDF,
``{..., "file": "onto.ttl", "statement": 17, "iri": ["http://...", "http://...", "http://..."]}``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from seeder.data.store import KnowledgeGraph


class EdgeIndex:
    """The edges of one dataset, sorted by (head, relation, tail), with what each row's provenance needs.

    Built on first use from the edges table's id columns (about 24 bytes an edge): a retriever builds it
    on its first call, not at load.
    """

    def __init__(self, kg: KnowledgeGraph):
        self.kg = kg
        self.version = kg.fingerprint
        self.files: list[dict[str, Any]] = list(kg.manifest.get("edge_sources") or [])

    @cached_property
    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        edges = self.kg.table("edges", ["src", "dst", "relation"])
        keys = self._keys(edges.column("src").to_numpy(), edges.column("relation").to_numpy(), edges.column("dst").to_numpy())
        order = np.argsort(keys, kind="stable")
        return keys[order], order

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        edges = self.kg.table("edges")
        if "source_file" not in edges.column_names:
            return {}
        return {name: edges.column(name).to_numpy() for name in ("source_file", "source_row")}

    @cached_property
    def _iris(self) -> tuple[np.ndarray, np.ndarray] | None:
        nodes, relations = self.kg.table("nodes"), self.kg.relations
        if "iri" not in nodes.column_names or "iri" not in relations.column_names:
            return None
        return (
            np.asarray(nodes.column("iri").to_pylist(), dtype=object),
            np.asarray(relations.column("iri").to_pylist(), dtype=object),
        )

    def _keys(self, heads: np.ndarray, relations: np.ndarray, tails: np.ndarray) -> np.ndarray:
        n, r = self.kg.num_nodes, self.kg.num_relations
        if n * n * r >= 2**63:  # the key would overflow int64: a graph this size needs a two-level search
            raise ValueError(f"{self.kg.path}: {n:,} nodes x {r} relations is too large for one int64 edge key")
        return (heads.astype(np.int64) * r + relations.astype(np.int64)) * n + tails.astype(np.int64)

    def rows(self, heads: np.ndarray, relations: np.ndarray, tails: np.ndarray) -> np.ndarray:
        """The edges-table row of each (head, base relation, tail); -1 where it is not an edge."""
        keys, order = self._sorted
        wanted = self._keys(np.asarray(heads), np.asarray(relations), np.asarray(tails))
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        found = (keys[at] == wanted) if len(keys) else np.zeros(len(wanted), dtype=bool)
        return np.where(found, order[at] if len(keys) else -1, -1)

    def sources(self, heads: np.ndarray, relations: np.ndarray, tails: np.ndarray) -> list[dict[str, Any]]:
        """One provenance dict per triple (see the module's docstring); ``{"dataset": version}`` alone
        for a triple that is not an edge of this version."""
        rows = self.rows(heads, relations, tails)
        out: list[dict[str, Any]] = [
            {"dataset": self.version, "edge": int(row)} if row >= 0 else {"dataset": self.version} for row in rows.tolist()
        ]
        if self._columns:
            valid = rows >= 0
            file_index = np.where(valid, self._columns["source_file"][np.maximum(rows, 0)], -1)
            source_row = self._columns["source_row"][np.maximum(rows, 0)]
            for entry, f, row in zip(out, file_index.tolist(), source_row.tolist()):
                if f >= 0:
                    source = self.files[f]
                    entry["dataset"] = source.get("dataset") or self.version
                    entry["file"] = source["file"]
                    entry[source.get("unit", "row")] = int(row)
        if self._iris is not None:
            node_iris, relation_iris = self._iris
            for entry, h, r, t in zip(
                out, np.asarray(heads).tolist(), np.asarray(relations).tolist(), np.asarray(tails).tolist()
            ):
                entry["iri"] = [node_iris[h], relation_iris[r], node_iris[t]]
        return out
